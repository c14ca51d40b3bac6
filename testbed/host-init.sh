#!/bin/sh
# Stage 2 of a testbed host's boot; see docs/testbed.md.
#
# testbed.py runs this as PID 1 of a fresh PID namespace, inside the host's network namespace and fresh mount,
# UTS, IPC and cgroup namespaces:
#   ip netns exec sl-nodeI unshare --pid --fork --mount --uts --ipc --cgroup --propagation private \
#       /bin/sh host-init.sh DIR HOSTNAME HIERARCHY...
# after moving itself into the host's cgroup on every hierarchy.  It builds the host's root file system and
# replaces itself with systemd.
#
#   DIR        the host's state directory (a tmpfs) holding upper/, work/ and the mount point root/
#   HOSTNAME   the host's name
#   HIERARCHY  the machine's cgroup mounts under /sys/fs/cgroup (cpu, memory, ..., systemd, unified)
set -eu

dir=$1
name=$2
shift 2
root=$dir/root

hostname "$name"

# The host's root: the machine's / read-only below, the host's own upper directory above.
mount -t overlay overlay -o "lowerdir=/,upperdir=$dir/upper,workdir=$dir/work" "$root"

# A private /dev with the usual container devices: nothing a host does there touches the machine's /dev.
mount -t tmpfs -o nosuid,mode=755,size=4m dev "$root/dev"
mkdev() { mknod -m 666 "$root/dev/$1" c "$2" "$3"; }
mkdev null 1 3
mkdev zero 1 5
mkdev full 1 7
mkdev random 1 8
mkdev urandom 1 9
mkdev tty 5 0
mkdir "$root/dev/pts" "$root/dev/shm" "$root/dev/mqueue"
mount -t devpts -o nosuid,noexec,newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o nosuid,nodev,mode=1777 shm "$root/dev/shm"
mount -t mqueue -o nosuid,nodev,noexec mqueue "$root/dev/mqueue"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"

# /sys as `ip netns exec` mounted it for this network namespace, read-only: sysfs is global.  Then the cgroup
# hierarchies, writable: mounted inside the cgroup namespace, each shows the host's own cgroup as its root.
mount --rbind /sys "$root/sys"
mount -o remount,bind,ro "$root/sys"
mount -t tmpfs -o nosuid,nodev,noexec,mode=755 cgroup "$root/sys/fs/cgroup"
for hierarchy in "$@"; do
    mkdir "$root/sys/fs/cgroup/$hierarchy"
    case $hierarchy in
        unified) mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$root/sys/fs/cgroup/unified" ;;
        systemd) mount -t cgroup -o nosuid,nodev,noexec,none,name=systemd cgroup "$root/sys/fs/cgroup/systemd" ;;
        *) mount -t cgroup -o "nosuid,nodev,noexec,$hierarchy" cgroup "$root/sys/fs/cgroup/$hierarchy" ;;
    esac
done

# Switch to the new root; the old one is detached so the host keeps no reference to the machine's mounts.
cd "$root"
mkdir -p .testbed-oldroot
pivot_root . .testbed-oldroot
cd /
mount -t proc -o nosuid,nodev,noexec proc /proc
# Most sysctls are global: read-only, except the network ones, which belong to the host's network namespace.
mount --bind /proc/sys /proc/sys
mount --bind /proc/sys/net /proc/sys/net
mount -o remount,bind,ro /proc/sys
if [ -e /proc/sysrq-trigger ]; then
    mount --bind /proc/sysrq-trigger /proc/sysrq-trigger
    mount -o remount,bind,ro /proc/sysrq-trigger
fi
mount -t tmpfs -o nosuid,nodev,mode=755 tmpfs /run
mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /tmp
# Container storage (python_env_mode: container) on a tmpfs of its own: podman's overlay driver cannot keep its
# layers on the overlay root.  Empty until a deployment loads an image; only what is stored takes memory.
mkdir -p /var/lib/containers
mount -t tmpfs -o nosuid,nodev,mode=0700,size=4g containers /var/lib/containers
umount -l /.testbed-oldroot
rmdir /.testbed-oldroot

exec /lib/systemd/systemd --system
