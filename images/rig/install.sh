#!/bin/sh
# Install the HIL link rig on a rig box (Raspberry Pi OS Lite 12 "bookworm", or any Debian 12), from a
# checkout of this repository: the rig program (hil_tests/rig, nothing else of the project), its systemd
# unit and user, the udev rule for its serial line, the kernel modules it needs, /etc/hil-rig/rig.env, and
# a NetworkManager drop-in that leaves the rig's ports and bridge unmanaged. docs/hil.md walks through
# building a bench with it.
#
#   sudo images/rig/install.sh --ports eth0,eth1 [--gadget]
#   images/rig/install.sh --root DIR [--ports ...] [--gadget]   # lay the files out under DIR only
#
# --ports IF1,IF2  the two Ethernet ports to bridge, gateway side first (written to rig.env)
# --gadget         the serial line is the Pi's USB gadget (g_serial on the USB-C / OTG port): loads
#                  dwc2 and g_serial at boot and adds dtoverlay=dwc2 to the boot config
# --root DIR       no packages, no users, no systemctl: only the files, under DIR (image builds, checks)
#
# Run again to update; an edited /etc/hil-rig/rig.env is kept (--ports changes only its RIG_PORTS line).
set -eu

usage() { sed -n '7,15p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "install.sh: $*" >&2; exit 1; }

ROOT=""
PORTS=""
GADGET=0
while [ $# -gt 0 ]; do
    case "$1" in
        --root) [ $# -ge 2 ] || die "--root needs a folder"; ROOT=$2; shift 2 ;;
        --ports) [ $# -ge 2 ] || die "--ports needs IF1,IF2"; PORTS=$2; shift 2 ;;
        --gadget) GADGET=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" ;;
    esac
done
if [ -n "$PORTS" ]; then
    case "$PORTS" in
        *,*,*|,*|*,|*" "*) die "--ports takes two interface names, IF1,IF2: got '$PORTS'" ;;
        *,*) [ "${PORTS%,*}" != "${PORTS#*,}" ] || die "--ports needs two different interfaces: got '$PORTS'" ;;
        *) die "--ports takes two interface names, IF1,IF2: got '$PORTS'" ;;
    esac
fi

SRC=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$SRC/images/rig"
[ -f "$SRC/hil_tests/rig/program.py" ] || die "run it from a checkout of the repository ($SRC has no hil_tests/rig)"

if [ -z "$ROOT" ]; then
    [ "$(id -u)" = 0 ] || die "run as root (or give --root DIR)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-serial iproute2 nftables
fi

# The program: hil_tests/rig needs only the standard library and pyserial (python3-serial).
APP="$ROOT/opt/hil-rig"
rm -rf "$APP/hil_tests"
install -d "$APP/hil_tests/rig" "$APP/docs"
install -m 0644 "$SRC/hil_tests/__init__.py" "$APP/hil_tests/"
install -m 0644 "$SRC"/hil_tests/rig/*.py "$SRC/hil_tests/rig/PROTOCOL.md" "$APP/hil_tests/rig/"
install -m 0644 "$SRC/docs/hil.md" "$APP/docs/"

install -D -m 0644 "$SRC/systemd/hil-rig.service" "$ROOT/usr/lib/systemd/system/hil-rig.service"
install -D -m 0644 "$SRC/systemd/hil-rig.sysusers" "$ROOT/usr/lib/sysusers.d/hil-rig.conf"
install -D -m 0644 "$HERE/99-hil-rig.rules" "$ROOT/etc/udev/rules.d/99-hil-rig.rules"
install -D -m 0644 "$HERE/modules-load.conf" "$ROOT/etc/modules-load.d/hil-rig.conf"
install -d "$ROOT/etc/systemd/system/multi-user.target.wants"
ln -sf /usr/lib/systemd/system/hil-rig.service "$ROOT/etc/systemd/system/multi-user.target.wants/hil-rig.service"

ENV_FILE="$ROOT/etc/hil-rig/rig.env"
if [ ! -e "$ENV_FILE" ]; then
    install -D -m 0644 "$HERE/rig.env" "$ENV_FILE"
fi
if [ -n "$PORTS" ]; then
    # Only the ports: RIG_OPTIONS and comments an operator wrote stay as they are.
    if grep -q '^RIG_PORTS=' "$ENV_FILE"; then
        sed -i "s/^RIG_PORTS=.*/RIG_PORTS=$PORTS/" "$ENV_FILE"
    else
        printf 'RIG_PORTS=%s\n' "$PORTS" >> "$ENV_FILE"
    fi
fi

# Raspberry Pi OS bookworm runs NetworkManager, which would run DHCP (and IPv6 autoconfiguration) on the
# rig's ports: it must leave them, and the bridge, alone. Written from the RIG_PORTS in force and the
# bridge the unit uses (hilbr0, or --bridge in RIG_OPTIONS); run install.sh again after changing either.
RIG_PORTS_NOW=$(sed -n 's/^RIG_PORTS=//p' "$ENV_FILE" | tail -n 1)
RIG_BRIDGE=$(sed -n 's/^RIG_OPTIONS=.*--bridge[ =]\([A-Za-z0-9_.@-]*\).*/\1/p' "$ENV_FILE" | tail -n 1)
UNMANAGED=""
for device in $(echo "$RIG_PORTS_NOW" | tr ',' ' ') "${RIG_BRIDGE:-hilbr0}"; do
    UNMANAGED="${UNMANAGED:+$UNMANAGED;}interface-name:$device"
done
install -d "$ROOT/etc/NetworkManager/conf.d"
cat > "$ROOT/etc/NetworkManager/conf.d/90-hil-rig.conf" <<EOF_NM
# Written by images/rig/install.sh from /etc/hil-rig/rig.env: NetworkManager leaves the HIL rig's ports and
# bridge alone (no DHCP, no IPv6 autoconfiguration on them). Run install.sh again after changing RIG_PORTS.
[keyfile]
unmanaged-devices=$UNMANAGED
EOF_NM

if [ "$GADGET" = 1 ]; then
    printf '# The rig box'"'"'s serial line: the USB gadget g_serial (ttyGS0) on the dwc2 controller.\ndwc2\ng_serial\n' \
        > "$ROOT/etc/modules-load.d/hil-rig-gadget.conf"
    BOOT_CONFIG="$ROOT/boot/firmware/config.txt"
    [ -e "$BOOT_CONFIG" ] || BOOT_CONFIG="$ROOT/boot/config.txt"
    if [ -e "$BOOT_CONFIG" ]; then
        grep -qx 'dtoverlay=dwc2' "$BOOT_CONFIG" || printf '\n[all]\ndtoverlay=dwc2\n' >> "$BOOT_CONFIG"
    else
        echo "install.sh: no boot config found: add dtoverlay=dwc2 to config.txt on the boot partition" >&2
    fi
fi

if [ -z "$ROOT" ]; then
    systemd-sysusers hil-rig.conf
    systemctl restart systemd-modules-load.service
    udevadm control --reload
    udevadm trigger --subsystem-match=tty
    if systemctl is-active --quiet NetworkManager.service; then
        systemctl reload NetworkManager.service
    fi
    systemctl daemon-reload
    systemctl enable hil-rig.service
    systemctl restart hil-rig.service
    echo "installed and started; it opens /dev/hilrig when the line appears (journalctl -u hil-rig shows its ready line)"
fi
