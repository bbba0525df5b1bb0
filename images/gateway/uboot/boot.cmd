# The gateway's A/B boot selector, one script for the Raspberry Pi (u-boot-rpi) and QEMU's virt machine
# (u-boot-qemu as -bios). U-Boot's distro boot finds it as boot.scr on the bootable FAT partition and sets
# ${devtype} ${devnum} (mmc 0 on the Pi, virtio 0 under QEMU). images/gateway/README.md, "A/B updates".
#
# The boot state lives in gw-boot.env on that FAT partition, read and written here (fatload, env import,
# env export, fatwrite) and by appliance-boot-state under Linux (RAUC's custom bootloader backend):
#   BOOT_ORDER   slots to try, first preferred ("A B")
#   BOOT_x_LEFT  boot attempts left for slot x; each boot of x takes one, a good boot gives them back
# A slot whose attempts are spent is skipped: the next one in BOOT_ORDER boots (the fallback).

setenv BOOT_ORDER "A B"
setenv BOOT_A_LEFT 3
setenv BOOT_B_LEFT 3
if fatload ${devtype} ${devnum}:1 ${kernel_addr_r} gw-boot.env; then
  env import -t ${kernel_addr_r} ${filesize} BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT
fi

setenv slot
for candidate in ${BOOT_ORDER}; do
  if test "x${slot}" = "x"; then
    if test "${candidate}" = "A" && test ${BOOT_A_LEFT} -gt 0; then
      setexpr BOOT_A_LEFT ${BOOT_A_LEFT} - 1
      setenv slot A
      setenv rootpart 2
    fi
    if test "${candidate}" = "B" && test ${BOOT_B_LEFT} -gt 0; then
      setexpr BOOT_B_LEFT ${BOOT_B_LEFT} - 1
      setenv slot B
      setenv rootpart 3
    fi
  fi
done

if test "x${slot}" = "x"; then
  # Both slots spent their attempts: give both their attempts back and start over, rather than stop
  # a gateway in the field for good.
  echo "gateway: no slot has boot attempts left; resetting the counts"
  setenv BOOT_A_LEFT 3
  setenv BOOT_B_LEFT 3
  env export -t ${kernel_addr_r} BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT
  fatwrite ${devtype} ${devnum}:1 ${kernel_addr_r} gw-boot.env ${filesize}
  reset
fi

# The attempt is counted before the kernel starts: a kernel that hangs or panics has used it up.
env export -t ${kernel_addr_r} BOOT_ORDER BOOT_A_LEFT BOOT_B_LEFT
fatwrite ${devtype} ${devnum}:1 ${kernel_addr_r} gw-boot.env ${filesize}
echo "gateway: booting slot ${slot} (partition ${rootpart}; attempts left A=${BOOT_A_LEFT} B=${BOOT_B_LEFT})"

part uuid ${devtype} ${devnum}:${rootpart} rootuuid
# The Pi's firmware hands U-Boot its device tree at ${fdt_addr}; QEMU's at ${fdtcontroladdr}.
if test -n "${fdt_addr}"; then setenv fdt ${fdt_addr}; else setenv fdt ${fdtcontroladdr}; fi
if test "${devtype}" = "virtio"; then setenv console ttyAMA0; else setenv console "ttyS1,115200 console=tty0"; fi
setenv bootargs "root=PARTUUID=${rootuuid} rw rootwait rauc.slot=${slot} console=${console} net.ifnames=0 fsck.repair=yes"
load ${devtype} ${devnum}:${rootpart} ${kernel_addr_r} /boot/vmlinuz
load ${devtype} ${devnum}:${rootpart} ${ramdisk_addr_r} /boot/initrd.img
booti ${kernel_addr_r} ${ramdisk_addr_r}:${filesize} ${fdt}
