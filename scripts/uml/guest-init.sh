#!/bin/sh
# PID 1 inside user-mode Linux (see scripts/uml/run). The root file system is the host's `/`
# through hostfs, read-write: guest state lives on a tmpfs at /run. The kernel command line
# gives UMLJOB (the host directory holding job.sh) and UML_MODULES (holding <release>/).
# The job's exit status is written to $UMLJOB/exit-status: UML itself always exits 0.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/tmp /run/bin /run/netns /run/modroot/lib/modules
chmod 1777 /run/tmp
ln -s "${UML_MODULES:-/usr/lib/uml/modules}/$(uname -r)" /run/modroot/lib/modules/
# The host has no /lib/modules for this kernel: modprobe (explicit and the kernel's autoload)
# reads the UML package's modules.
# The kernel runs it with an empty environment: GLIBC_TUNABLES (see scripts/uml/run) is
# carried in.
printf '#!/bin/sh\nexport GLIBC_TUNABLES="%s"\nexec /usr/sbin/modprobe -d /run/modroot "$@"\n' "${GLIBC_TUNABLES:-}" > /run/bin/modprobe
chmod +x /run/bin/modprobe
echo /run/bin/modprobe > /proc/sys/kernel/modprobe
export PATH=/run/bin:$PATH TMPDIR=/run/tmp UML_GUEST=1 HOME=/run/tmp
# IPv6 is a module here; /proc/sys/net/ipv6 exists only once it is loaded (nothing autoloads it).
modprobe ipv6
ip link set lo up
rc=125
if cd "$UMLJOB"; then
  sh ./job.sh > console.log 2>&1
  rc=$?
fi
echo "$rc" > "$UMLJOB/exit-status.tmp" && mv "$UMLJOB/exit-status.tmp" "$UMLJOB/exit-status"
sync
poweroff -f
