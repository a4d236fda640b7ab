#!/bin/sh
# PID 1 inside the QEMU tier (see scripts/vm/run), after the initramfs mounted the host's `/`
# over 9p, read-write: guest state lives on a tmpfs at /run. The kernel command line gives
# VMJOB (the host directory holding job.sh) and VM_MODULES (the image's root, holding
# lib/modules/<release>/). The job's exit status is written to $VMJOB/exit-status.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /dev/pts /run/tmp /run/bin /run/netns
mount -t devpts devpts /dev/pts
chmod 1777 /run/tmp
# The host has no /lib/modules for this kernel: modprobe (explicit and the kernel's autoload)
# reads the image's.
printf '#!/bin/sh\nexec /usr/sbin/modprobe -d %s "$@"\n' "$VM_MODULES" > /run/bin/modprobe
chmod +x /run/bin/modprobe
echo /run/bin/modprobe > /proc/sys/kernel/modprobe
export PATH=/run/bin:$PATH TMPDIR=/run/tmp VM_GUEST=1 HOME=/run/tmp
ip link set lo up
rc=125
if cd "$VMJOB"; then
  sh ./job.sh > console.log 2>&1
  rc=$?
fi
echo "$rc" > "$VMJOB/exit-status.tmp" && mv "$VMJOB/exit-status.tmp" "$VMJOB/exit-status"
sync
poweroff -f
