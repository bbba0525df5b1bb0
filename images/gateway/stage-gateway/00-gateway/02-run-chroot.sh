#!/bin/bash -e
# pi-gen, inside the image (ARM chroot): user, venv with the wheel and its dependencies, file ownership.
systemd-sysusers /usr/lib/sysusers.d/appliance.conf
python3 -m venv /opt/appliance/venv
/opt/appliance/venv/bin/pip install --no-cache-dir /opt/appliance/wheels/appliance-*.whl
/opt/appliance/venv/bin/appliance check-config --config /etc/appliance/gateway.toml > /dev/null
chown -R root:appliance /etc/appliance
chmod 0755 /etc/appliance
chmod 0640 /etc/appliance/*
