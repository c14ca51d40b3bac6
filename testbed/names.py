"""Names and places of one testbed instance (SHADOWLINE_TESTBED=<i>, read once at import): addresses, bridge,
namespaces, cgroups, state, inventory, timeouts, the packages hosts need and the units they must not run."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
HOST_INIT = Path(__file__).resolve().parent / "host-init.sh"

# Several testbeds can run side by side on one machine (e.g. parallel test jobs): SHADOWLINE_TESTBED=<i>
# (0..9, default 0) gives each its own bridge, /24, namespaces, cgroups, state and inventory.
INSTANCE = int(os.environ.get("SHADOWLINE_TESTBED", "0") or 0)
if not 0 <= INSTANCE <= 9:
    raise SystemExit(f"SHADOWLINE_TESTBED={INSTANCE}: must be 0..9")
SUFFIX = f"-{INSTANCE}" if INSTANCE else ""

TESTBED_DIR = REPO_ROOT / f".testbed{SUFFIX}"
KEY_FILE = TESTBED_DIR / "id_ed25519"
# the hosts' own ssh host keys (each host makes its own on `up`), the only keys ssh and Ansible accept for them
KNOWN_HOSTS = TESTBED_DIR / "known_hosts"
STATE_JSON = TESTBED_DIR / "state.json"
# Instance 0 writes the inventory users run (-i inventories/testbed); others write theirs beside their state,
# with a link to the same group_vars.
INVENTORY = (REPO_ROOT / "inventories" / "testbed" / "hosts.yml" if not INSTANCE
             else TESTBED_DIR / "inventory" / "hosts.yml")
GROUP_VARS = REPO_ROOT / "inventories" / "testbed" / "group_vars"

# Machine-wide, per instance.
STATE_ROOT = Path(f"/var/lib/shadowline-testbed{SUFFIX}")
JOURNAL = STATE_ROOT / "journal.json"
LOCK_FILE = Path(f"/run/lock/shadowline-testbed{SUFFIX}.lock")
CGROUP_MOUNT = Path("/sys/fs/cgroup")
CGROUP_PARENT = f"shadowline-testbed{SUFFIX}"
NETNS_DIR = Path("/run/netns")

BRIDGE = f"slbr{INSTANCE}"
PREFIX = f"198.18.{INSTANCE}"  # 198.18.0.0/15 is reserved for benchmarks (RFC 2544); one /24 per instance
BRIDGE_ADDRESS = f"{PREFIX}.1"
NAME_PREFIX = f"sl{INSTANCE if INSTANCE else ''}-"  # network namespaces and root-side veths: sl-node0 ...
MAX_NODES = 8
HOST_TMPFS_SIZE = "1g"  # upper-directory ceiling per host; only what is written counts
SSH_PORT = 22

BOOT_TIMEOUT = 60.0
SLURM_TIMEOUT = 60.0
KILL_TIMEOUT = 15.0

PACKAGE_LIST = REPO_ROOT / "bindep.txt"  # the one list (its dpkg lines); scripts/setup-system installs them
PACKAGES = list(dict.fromkeys(line.split()[0] for line in PACKAGE_LIST.read_text().splitlines()
                              if "platform:dpkg" in line and not line.lstrip().startswith("#")))

# Units a host must not run.  Besides these, every unit enabled in the machine's /etc/systemd/system/*.wants/
# (what packages enabled by themselves) is masked unless the host needs it: see masked_units().
ALWAYS_MASKED = [
    # services of the project's packages: never by themselves (--slurm enables munge and Slurm; an Ansible role
    # that runs one unmasks it first, e.g. ansible.builtin.systemd_service with masked: false)
    "etcd.service", "etcd2.service", "nats-server.service", "haproxy.service", "postgresql.service",
    "munge.service", "slurmd.service", "slurmctld.service", "slurmdbd.service",
    # consoles: a getty would take the machine's terminals
    "getty@tty1.service", "console-getty.service", "getty-static.service", "serial-getty@console.service",
    "container-getty@.service", "getty.target",
    # timers and housekeeping
    "apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer", "e2scrub_all.timer",
    "e2scrub_reap.service", "fstrim.timer", "man-db.timer", "systemd-tmpfiles-clean.timer",
    # the kernel and the hardware are the machine's: nothing to load, mount, seed or tune per host
    "modprobe@.service", "kmod-static-nodes.service", "systemd-modules-load.service", "systemd-sysctl.service",
    "systemd-binfmt.service", "proc-sys-fs-binfmt_misc.automount", "dev-hugepages.mount",
    "sys-kernel-debug.mount", "sys-kernel-tracing.mount", "sys-kernel-config.mount",
    "sys-fs-fuse-connections.mount", "systemd-tmpfiles-setup-dev.service", "systemd-remount-fs.service",
    "systemd-random-seed.service", "systemd-pstore.service", "systemd-timesyncd.service",
    "systemd-pcrphase.service", "systemd-pcrphase-sysinit.service", "systemd-repart.service",
    "systemd-firstboot.service", "systemd-machine-id-commit.service", "systemd-hwdb-update.service",
    "ldconfig.service", "systemd-update-done.service", "systemd-journal-catalog-update.service",
    "systemd-journal-flush.service", "systemd-sysusers.service",
    "systemd-ask-password-wall.path", "systemd-ask-password-console.path",
]
SSH_UNITS = {"ssh.service", "sshd.service"}
SLURM_UNITS = {"munge.service", "slurmd.service"}  # every host; slurmctld.service on node0 only
