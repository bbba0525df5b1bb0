#!/bin/bash -e
# pi-gen, on the build host: copy the tree that `make image-tree` staged into the image's root.
# The tree's venv was built with the build machine's interpreter for CI checks; it is not copied,
# 02-run-chroot.sh builds the real one inside the image.
TREE="${GATEWAY_TREE:?set GATEWAY_TREE to the build/image-tree made by make image-tree}"
rsync -a --exclude /opt/appliance/venv "${TREE}/" "${ROOTFS_DIR}/"
