#!/usr/bin/python3
"""A multi-host testbed on one machine: N hosts with systemd, sshd and (optionally) Slurm.

Each host is a network namespace on a private bridge, an overlay of the machine's root and systemd as PID 1 of
its own PID, mount, UTS, IPC and cgroup namespaces.  See docs/testbed.md for the design and the measured figures.

Run as root:  testbed.py install-packages | up [--nodes N] [--slurm] | status | exec HOST -- CMD... | down | leaks

Importable too: up(nodes, slurm) -> State, down(), leaks() -> list[str], exec_in(host, argv, **kw).
Python standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

# --- names and places -----------------------------------------------------------------------------------------

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

PACKAGE_LIST = REPO_ROOT / "requirements" / "debian-packages.txt"  # the one list; scripts/setup-system installs it
PACKAGES = [line.strip() for line in PACKAGE_LIST.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]

# Units a host must not run.  Besides these, every unit enabled in the machine's /etc/systemd/system/*.wants/
# (what packages enabled by themselves) is masked unless the host needs it: see masked_units().
ALWAYS_MASKED = [
    # services of the project's packages: never by themselves (--slurm enables munge and Slurm; an Ansible role
    # that runs one unmasks it first, e.g. ansible.builtin.systemd_service with masked: false)
    "etcd.service", "etcd2.service", "nats-server.service", "postgresql.service",
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


# --- state ----------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Host:
    name: str
    index: int
    address: str
    pid: int | None = None
    launcher_pid: int | None = None

    @property
    def netns(self) -> str:
        return f"{NAME_PREFIX}{self.name}"

    @property
    def veth(self) -> str:
        return f"{NAME_PREFIX}{self.name}"

    @property
    def dir(self) -> Path:
        return STATE_ROOT / self.name


@dataclasses.dataclass
class State:
    nodes: int
    slurm: bool
    hosts: list[Host]
    boot_seconds: float | None = None
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds since the start of up
    run_netns_created: bool = False  # by our `ip netns add`: down() removes /run/netns again
    run_netns_mounted: bool = False

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise TestbedError(f"no host {name!r} in the testbed (hosts: {', '.join(h.name for h in self.hosts)})")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> State:
        hosts = [Host(**h) for h in data.pop("hosts")]
        return cls(hosts=hosts, **data)


class TestbedError(RuntimeError):
    """A testbed operation failed; the message says what and what to do."""


def plan(nodes: int, slurm: bool) -> State:
    hosts = [Host(name=f"node{i}", index=i, address=f"{PREFIX}.{10 + i}") for i in range(nodes)]
    return State(nodes=nodes, slurm=slurm, hosts=hosts)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def save_journal(state: State) -> None:
    """Record what exists (or is about to): down() reads this, and discovers by name whatever it misses."""
    write_json_atomic(JOURNAL, state.to_json())


def load_journal() -> State | None:
    try:
        return State.from_json(json.loads(JOURNAL.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError) as exc:
        print(f"testbed: ignoring unreadable {JOURNAL}: {exc}", file=sys.stderr)
        return None


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """One testbed operation at a time on this machine."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# --- small helpers --------------------------------------------------------------------------------------------

def run(argv: Sequence[str], check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    proc = subprocess.run(list(argv), text=True, **kw)
    if check and proc.returncode != 0:
        raise TestbedError(f"{' '.join(argv)} failed ({proc.returncode}): {(proc.stderr or '').strip()}")
    return proc


def require_root() -> None:
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (namespaces, mounts, cgroups, bridge)")


def wait_until(what: str, timeout: float, probe: Any, interval: float = 0.02) -> Any:
    """Call probe() until it returns something truthy; raise a clear error after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TestbedError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def pid_alive(pid: int | None) -> bool:
    """True while pid exists and is not a zombie."""
    if not pid:
        return False
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return fields[0] != "Z"


def in_testbed_cgroup(pid: int) -> bool:
    try:
        return f"/{CGROUP_PARENT}/" in Path(f"/proc/{pid}/cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def mib(n_bytes: int | None) -> str:
    return "-" if n_bytes is None else f"{n_bytes / 2**20:.1f} MiB"


# --- cgroups --------------------------------------------------------------------------------------------------

def hierarchies() -> list[Path]:
    """Every cgroup mount of the machine: the v1 controllers, name=systemd and the cgroup2 mount."""
    return sorted(p for p in CGROUP_MOUNT.iterdir()
                  if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists())


def host_cgroups(name: str) -> list[Path]:
    return [h / CGROUP_PARENT / name for h in hierarchies()]


def make_host_cgroups(name: str) -> None:
    for hierarchy in hierarchies():
        for path in (hierarchy / CGROUP_PARENT, hierarchy / CGROUP_PARENT / name):
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":  # a cpuset cgroup takes no task until it has cpus and mems
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    if not (path / knob).read_text().strip():
                        (path / knob).write_text((path.parent / knob).read_text())


def enter_host_cgroups(name: str) -> None:
    """preexec_fn: the launcher moves itself into the host's cgroups before unshare makes them its ns root."""
    pid = str(os.getpid())
    for path in host_cgroups(name):
        (path / "cgroup.procs").write_text(pid)


def testbed_cgroup_dirs() -> list[Path]:
    """All cgroup directories of the testbed, deepest first."""
    found: list[Path] = []
    for hierarchy in hierarchies():
        top = hierarchy / CGROUP_PARENT
        if top.is_dir():
            found.extend(Path(d) for d, _, _ in os.walk(top))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def cgroup_pids(dirs: list[Path]) -> set[int]:
    pids: set[int] = set()
    for path in dirs:
        with contextlib.suppress(FileNotFoundError, OSError):
            pids.update(int(line) for line in (path / "cgroup.procs").read_text().split() if line != "0")
    return pids


def memory_usage(name: str) -> int | None:
    path = CGROUP_MOUNT / "memory" / CGROUP_PARENT / name / "memory.usage_in_bytes"
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def remove_cgroups() -> list[str]:
    """rmdir every testbed cgroup, deepest first; returns the ones that would not go."""
    stuck: list[str] = []
    for path in testbed_cgroup_dirs():
        for attempt in range(50):
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or attempt == 49:
                    stuck.append(f"{path}: {exc.strerror}")
                    break
                time.sleep(0.02)
    return stuck


# --- network --------------------------------------------------------------------------------------------------

def link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def testbed_links() -> list[str]:
    return sorted(n for n in os.listdir("/sys/class/net") if n == BRIDGE or n.startswith(NAME_PREFIX))


def testbed_netns() -> list[str]:
    out = run(["ip", "netns", "list"], check=False).stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.startswith(NAME_PREFIX))


def is_mountpoint(path: Path) -> bool:
    return any(mountpoint == str(path) for mountpoint in mountpoints())


def mountpoints() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        points.append(line.split()[4].replace("\\040", " "))
    return points


def make_bridge() -> None:
    if not link_exists(BRIDGE):
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "addr", "replace", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def make_host_network(host: Host) -> None:
    """netns sl-nodeI; veth sl-nodeI on the bridge, its peer eth0 in the netns; no route but the /24."""
    if host.netns not in testbed_netns():
        run(["ip", "netns", "add", host.netns])
    if not link_exists(host.veth):
        run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns])
    run(["ip", "link", "set", host.veth, "master", BRIDGE, "up"])
    inside = ["ip", "-n", host.netns]
    run([*inside, "link", "set", "lo", "up"])
    run([*inside, "addr", "replace", f"{host.address}/24", "dev", "eth0"])
    run([*inside, "link", "set", "eth0", "up"])


# --- the host's upper directory -------------------------------------------------------------------------------

def mirror_dirs(upper: Path, rel: Path) -> None:
    """Create upper/rel's parents with the owner and mode of the machine's dirs (an upper dir hides them)."""
    path = upper
    for part in rel.parent.parts:
        path = path / part
        lower = Path("/") / path.relative_to(upper)
        if path.is_dir():
            continue
        path.mkdir()
        if lower.is_dir():
            st = lower.stat()
            os.chown(path, st.st_uid, st.st_gid)
            os.chmod(path, stat.S_IMODE(st.st_mode))


def seed_file(upper: Path, rel: str, text: str, mode: int = 0o644, owner: tuple[int, int] = (0, 0)) -> None:
    target = upper / rel
    mirror_dirs(upper, Path(rel))
    target.write_text(text)
    os.chown(target, *owner)
    os.chmod(target, mode)


def seed_symlink(upper: Path, rel: str, dest: str) -> None:
    target = upper / rel
    mirror_dirs(upper, Path(rel))
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
    target.symlink_to(dest)


def enabled_units_on_machine() -> set[str]:
    """Units enabled in the machine's /etc/systemd/system/*.wants (what packages enabled by themselves)."""
    units = set()
    for wants in Path("/etc/systemd/system").glob("*.wants"):
        units.update(p.name for p in wants.iterdir())
    return units


def masked_units(host: Host, slurm: bool) -> list[str]:
    wanted = set(SSH_UNITS)
    if slurm:
        wanted |= SLURM_UNITS | ({"slurmctld.service"} if host.index == 0 else set())
    enabled = {u for u in enabled_units_on_machine() if not u.endswith(".target")}  # targets only group units
    return sorted((set(ALWAYS_MASKED) | enabled) - wanted)


def hosts_file(state: State) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             "ff02::1\tip6-allnodes", "ff02::2\tip6-allrouters"]
    lines += [f"{h.address}\t{h.name}" for h in state.hosts]
    return "\n".join(lines) + "\n"


def slurm_conf(state: State) -> str:
    controller = state.hosts[0]
    names = ",".join(h.name for h in state.hosts)
    nodes = "\n".join(
        f"NodeName={h.name} NodeAddr={h.address} CPUs={os.cpu_count()} CoresPerSocket={os.cpu_count()} "
        f"ThreadsPerCore=1 RealMemory=4000 State=UNKNOWN" for h in state.hosts)
    return f"""# Written by testbed/testbed.py for the shadowline testbed; see docs/testbed.md.
ClusterName=shadowline
SlurmctldHost={controller.name}({controller.address})
AuthType=auth/munge
CryptoType=crypto/munge
SlurmUser=slurm
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MailProg=/bin/true
ReturnToService=2
MpiDefault=none
KillWait=5
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=30
Waittime=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
{nodes}
PartitionName=gpu Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


CGROUP_CONF = """# Written by testbed/testbed.py for the shadowline testbed; see docs/testbed.md.
CgroupPlugin=cgroup/v1
ConstrainCores=yes
ConstrainRAMSpace=no
ConstrainDevices=no
"""

SSHD_CONF = """# Written by testbed/testbed.py: listen on the host's own address, root by key only.
ListenAddress {address}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""

# The machine's resolver is outside the testbed: hosts know each other from /etc/hosts and ask nobody else.
RESOLV_CONF = """# Written by testbed/testbed.py: testbed hosts resolve names from /etc/hosts only.
nameserver 127.0.0.1
options timeout:1 attempts:1
"""

JOURNALD_CONF = """# Written by testbed/testbed.py: keep each host's journal small and in memory.
[Journal]
Storage=volatile
RuntimeMaxUse=8M
"""


def seed_upper(host: Host, state: State, public_key: str) -> None:
    upper = host.dir / "upper"
    seed_file(upper, "etc/hostname", host.name + "\n")
    seed_file(upper, "etc/hosts", hosts_file(state))
    seed_file(upper, "etc/resolv.conf", RESOLV_CONF)
    seed_file(upper, "etc/machine-id", secrets.token_hex(16) + "\n", mode=0o444)
    seed_file(upper, "etc/ssh/sshd_config.d/shadowline-testbed.conf", SSHD_CONF.format(address=host.address))
    seed_file(upper, "root/.ssh/authorized_keys", public_key, mode=0o600)
    os.chmod(upper / "root/.ssh", 0o700)
    seed_file(upper, "etc/systemd/journald.conf.d/shadowline-testbed.conf", JOURNALD_CONF)
    for unit in masked_units(host, state.slurm):
        seed_symlink(upper, f"etc/systemd/system/{unit}", "/dev/null")
    seed_symlink(upper, "etc/systemd/system/multi-user.target.wants/ssh.service", "/lib/systemd/system/ssh.service")
    if state.slurm:
        seed_slurm(host, state, upper)


def seed_slurm(host: Host, state: State, upper: Path) -> None:
    seed_file(upper, "etc/slurm/slurm.conf", slurm_conf(state))
    seed_file(upper, "etc/slurm/cgroup.conf", CGROUP_CONF)
    units = sorted(SLURM_UNITS) + (["slurmctld.service"] if host.index == 0 else [])
    for unit in units:
        seed_symlink(upper, f"etc/systemd/system/multi-user.target.wants/{unit}", f"/lib/systemd/system/{unit}")


def prepare_host_dir(host: Host) -> None:
    """A tmpfs per host holds upper/, work/ and the mount point root/ (why a tmpfs: docs/testbed.md)."""
    host.dir.mkdir(parents=True, exist_ok=True)
    if not is_mountpoint(host.dir):
        run(["mount", "-t", "tmpfs", "-o", f"size={HOST_TMPFS_SIZE},mode=0755", f"shadowline-{host.name}",
             str(host.dir)])
    for sub in ("upper", "work", "root"):
        (host.dir / sub).mkdir(exist_ok=True)
    root_stat = os.stat("/")
    os.chmod(host.dir / "upper", stat.S_IMODE(root_stat.st_mode))


# --- keys and generated files ---------------------------------------------------------------------------------

def ensure_key() -> str:
    TESTBED_DIR.mkdir(mode=0o700, exist_ok=True)
    if not KEY_FILE.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "shadowline-testbed", "-f", str(KEY_FILE)])
    return KEY_FILE.with_suffix(".pub").read_text()


def inventory_text(state: State) -> str:
    lines = [
        "# Written by testbed/testbed.py on `up`, removed on `down`. Do not edit.",
        "all:",
        "  vars:",
        "    ansible_user: root",
        f"    ansible_ssh_private_key_file: {KEY_FILE}",
        "    ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        "    ansible_python_interpreter: /usr/bin/python3",
        f"    testbed_repo_root: {REPO_ROOT}",
        "  children:",
        "    gms_nodes:",
        "      hosts:",
    ]
    lines += [f"        {h.name}: {{ansible_host: {h.address}, gms_node_rank: {h.index}}}" for h in state.hosts]
    if state.slurm:
        compute = ", ".join(f"{h.name}: {{}}" for h in state.hosts)
        lines += [f"    slurm_controller: {{hosts: {{{state.hosts[0].name}: {{}}}}}}",
                  f"    slurm_compute: {{hosts: {{{compute}}}}}"]
    return "\n".join(lines) + "\n"


def write_outputs(state: State) -> None:
    INVENTORY.parent.mkdir(parents=True, exist_ok=True)
    INVENTORY.write_text(inventory_text(state))
    link = INVENTORY.parent / "group_vars"
    if INSTANCE and not link.is_symlink():
        link.symlink_to(GROUP_VARS)
    public = {
        "nodes": state.nodes, "slurm": state.slurm, "boot_seconds": state.boot_seconds,
        "key": str(KEY_FILE), "inventory": str(INVENTORY),
        "hosts": [{"name": h.name, "address": h.address, "pid": h.pid, "rank": h.index} for h in state.hosts],
    }
    write_json_atomic(STATE_JSON, public)


def remove_outputs() -> None:
    for path in (INVENTORY, STATE_JSON) + ((INVENTORY.parent / "group_vars",) if INSTANCE else ()):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    with contextlib.suppress(OSError):
        INVENTORY.parent.rmdir()


# --- boot -----------------------------------------------------------------------------------------------------

_launchers: dict[str, subprocess.Popen[bytes]] = {}  # reaped by down() when up() ran in this process


def launch_host(host: Host) -> None:
    argv = ["ip", "netns", "exec", host.netns, "unshare", "--pid", "--fork", "--mount", "--uts", "--ipc", "--cgroup",
            "--propagation", "private", "/bin/sh", str(HOST_INIT), str(host.dir), host.name,
            *(h.name for h in hierarchies())]
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "container": "shadowline-testbed",
           "LANG": "C.UTF-8"}
    log = open(host.dir / "boot.log", "wb")
    with log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd="/",
                                start_new_session=True, preexec_fn=lambda: enter_host_cgroups(host.name))
    _launchers[host.name] = proc
    host.launcher_pid = proc.pid  # `ip netns exec` execs unshare: this is unshare's pid


def find_pid1(host: Host) -> int | bool:
    """The host's systemd is the only child of the launcher (unshare --fork)."""
    launcher = _launchers.get(host.name)
    if launcher is None or launcher.poll() is not None:
        raise TestbedError(f"{host.name}: the launcher exited; {host.dir}/boot.log says: {boot_log(host)}")
    try:
        children = Path(f"/proc/{host.launcher_pid}/task/{host.launcher_pid}/children").read_text().split()
    except FileNotFoundError:
        return False
    if not children:
        return False
    pid = int(children[0])
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    return pid if comm == "systemd" else False


def boot_log(host: Host) -> str:
    with contextlib.suppress(FileNotFoundError):
        return (host.dir / "boot.log").read_text(errors="replace")[-2000:]
    return ""


def system_state(host: Host, timeout: float = 5.0) -> str:
    if not pid_alive(host.pid):
        return "dead"
    try:
        proc = exec_in(host.name, ["systemctl", "is-system-running"], timeout=timeout, pid=host.pid)
    except subprocess.TimeoutExpired:
        return "no-answer"
    return proc.stdout.strip() or "no-answer"


def wait_systemd(hosts: list[Host], timeout: float) -> None:
    """Wait for every host's systemd to finish starting up (running, or degraded if a unit failed)."""
    pending = {h.name: h for h in hosts}

    def probe() -> bool:
        for name, host in list(pending.items()):
            if not pid_alive(host.pid):
                raise TestbedError(f"{name}: systemd (pid {host.pid}) died while booting: {boot_log(host)}")
            if system_state(host) in ("running", "degraded"):
                del pending[name]
        return not pending

    wait_until(f"systemd on {', '.join(pending)} to reach running/degraded", timeout, probe, interval=0.05)


def ssh_banner(address: str) -> bool:
    try:
        with socket.create_connection((address, SSH_PORT), timeout=1) as conn:
            conn.settimeout(1)
            return conn.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def wait_sshd(hosts: list[Host], timeout: float) -> None:
    for host in hosts:
        wait_until(f"sshd on {host.name} ({host.address}:{SSH_PORT})", timeout, lambda: ssh_banner(host.address))


def slurm_node_states(state: State) -> dict[str, str]:
    proc = exec_in(state.hosts[0].name, ["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10, pid=state.hosts[0].pid)
    states = {}
    for line in proc.stdout.splitlines():
        name, node_state = line.split()
        states[name] = node_state
    return states


def wait_slurm(state: State, timeout: float) -> None:
    names = {h.name for h in state.hosts}

    def probe() -> bool:
        states = slurm_node_states(state)
        return set(states) == names and all(s == "idle" for s in states.values())

    wait_until(f"sinfo on {state.hosts[0].name} to show {', '.join(sorted(names))} idle", timeout, probe, 0.1)


def boot(state: State, public_key: str) -> None:
    started = time.monotonic()

    def phase(name: str) -> None:
        state.phases[name] = round(time.monotonic() - started, 3)

    make_bridge()
    for host in state.hosts:
        prepare_host_dir(host)
        seed_upper(host, state, public_key)
        make_host_cgroups(host.name)
        make_host_network(host)
    phase("prepared")
    for host in state.hosts:
        launch_host(host)
        save_journal(state)  # the launcher pid is known now
    for host in state.hosts:
        host.pid = wait_until(f"systemd of {host.name} to start", 10, lambda: find_pid1(host), 0.005)
        save_journal(state)
    phase("systemd started")
    wait_systemd(state.hosts, BOOT_TIMEOUT)
    phase("systemd running")
    wait_sshd(state.hosts, BOOT_TIMEOUT)
    phase("sshd answering")
    if state.slurm:
        wait_slurm(state, SLURM_TIMEOUT)
        phase("slurm nodes idle")


def record_run_netns(state: State) -> None:
    """`ip netns add` creates /run/netns and makes it a mount point; down() undoes what was not there before."""
    state.run_netns_created = not NETNS_DIR.exists()
    state.run_netns_mounted = not is_mountpoint(NETNS_DIR)


def up(nodes: int = 3, slurm: bool = False, keep_on_failure: bool = False) -> State:
    """Boot the testbed, or check a running one of the same shape. Returns its state."""
    require_root()
    if not 1 <= nodes <= MAX_NODES:
        raise TestbedError(f"--nodes must be 1..{MAX_NODES}, not {nodes}")
    with locked():
        running = load_journal()
        if running is not None:
            return check_running(running, nodes, slurm)
        check_packages(slurm)
        state = plan(nodes, slurm)
        public_key = ensure_key()
        started = time.monotonic()
        record_run_netns(state)
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        save_journal(state)  # every resource below is named after the journal's hosts, so down() finds it
        try:
            boot(state, public_key)
        except BaseException:
            if not keep_on_failure:
                _down_locked()
            raise
        state.boot_seconds = round(time.monotonic() - started, 2)
        save_journal(state)
        write_outputs(state)
        return state


def problems(state: State) -> dict[str, str]:
    """What is wrong with a running testbed, by host; empty when every host is healthy."""
    found = {h.name: s for h in state.hosts if (s := system_state(h)) not in ("running", "degraded")}
    found.update({h.name: "sshd not answering" for h in state.hosts
                  if h.name not in found and not ssh_banner(h.address)})
    if state.slurm and not found:
        try:
            nodes = slurm_node_states(state)
        except (subprocess.TimeoutExpired, ValueError) as exc:
            nodes = {"sinfo": str(exc)}
        found.update({n: f"slurm {s}" for n, s in nodes.items() if not s.startswith(("idle", "alloc", "mix"))})
    return found


def check_running(running: State, nodes: int, slurm: bool) -> State:
    if running.nodes != nodes or running.slurm != slurm:
        raise TestbedError(
            f"a testbed with {running.nodes} hosts (slurm {'on' if running.slurm else 'off'}) is up; you asked for "
            f"{nodes} (slurm {'on' if slurm else 'off'}): run `testbed.py down` first")
    if bad := problems(running):
        raise TestbedError(f"the running testbed is unhealthy ({bad}): run `testbed.py down` and `up` again")
    write_outputs(running)
    return running


def check_packages(slurm: bool) -> None:
    needed = ["systemd", "openssh-server", "iproute2", "util-linux"] + (["slurm-wlm", "munge"] if slurm else [])
    if missing := missing_packages(needed):
        raise TestbedError(f"missing packages {' '.join(missing)}: run `testbed.py install-packages` first")


# --- teardown -------------------------------------------------------------------------------------------------

def netns_pids() -> set[int]:
    pids: set[int] = set()
    for name in testbed_netns():
        out = run(["ip", "netns", "pids", name], check=False).stdout
        pids.update(int(p) for p in out.split())
    return pids


def kill_everything(state: State | None) -> None:
    """SIGKILL each host's systemd (the kernel then kills its PID namespace), then anything else of the testbed.

    The launchers (unshare) are left to reap their systemd and exit by themselves: killing them first would
    leave systemd's zombie to the machine's PID 1."""
    pid1s = [h.pid for h in state.hosts if pid_alive(h.pid) and in_testbed_cgroup(h.pid)] if state else []
    for pid in pid1s:  # checked above: never a reused pid of someone else
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(TestbedError):  # whatever is left is swept below
        wait_until("the hosts' systemd to exit", 5, lambda: not any(pid_alive(p) for p in pid1s), 0.005)

    def gone() -> bool:
        for name, proc in list(_launchers.items()):
            if proc.poll() is not None:
                del _launchers[name]
        pids = {p for p in cgroup_pids(testbed_cgroup_dirs()) | netns_pids() if pid_alive(p)}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return not pids and not _launchers

    wait_until("the testbed's processes to exit", KILL_TIMEOUT, gone, 0.01)


def delete_network(state: State | None) -> None:
    hosts = state.hosts if state else []
    links = {h.veth for h in hosts} | {n for n in testbed_links() if n != BRIDGE}
    for link in sorted(links):
        if link_exists(link):
            run(["ip", "link", "del", link], check=False)
    for name in sorted({h.netns for h in hosts} | set(testbed_netns())):
        if (NETNS_DIR / name).exists():
            run(["ip", "netns", "del", name])
    if link_exists(BRIDGE):
        run(["ip", "link", "del", BRIDGE])
    restore_run_netns(state)


def restore_run_netns(state: State | None) -> None:
    if state is None or not NETNS_DIR.is_dir() or any(NETNS_DIR.iterdir()):
        return  # still in use by other network namespaces of the machine
    if state.run_netns_mounted and is_mountpoint(NETNS_DIR):
        run(["umount", str(NETNS_DIR)], check=False)
    if state.run_netns_created and not is_mountpoint(NETNS_DIR):
        with contextlib.suppress(OSError):
            NETNS_DIR.rmdir()


def testbed_mounts() -> list[str]:
    root = str(STATE_ROOT)
    return [m for m in mountpoints() if m == root or m.startswith(root + "/")]


def unmount_all() -> None:
    for point in sorted(testbed_mounts(), key=lambda m: m.count("/"), reverse=True):
        if run(["umount", point], check=False).returncode != 0:
            run(["umount", "-l", point])


def _down_locked() -> float:
    started = time.monotonic()
    state = load_journal()
    kill_everything(state)
    delete_network(state)
    unmount_all()
    stuck = remove_cgroups()
    shutil.rmtree(STATE_ROOT, ignore_errors=True)
    remove_outputs()
    if stuck:
        raise TestbedError(f"cgroups that would not go: {stuck}")
    return time.monotonic() - started


def down() -> float:
    """Remove every trace of the testbed (also after a half-failed up, or when nothing is up). Returns seconds."""
    require_root()
    with locked():
        return _down_locked()


# --- inspection -----------------------------------------------------------------------------------------------

def leaks() -> list[str]:
    """Everything of the testbed still on the machine; empty when clean."""
    found = [f"process {p} in a testbed cgroup: {comm(p)}" for p in sorted(cgroup_pids(testbed_cgroup_dirs()))]
    found += [f"process {p} in a testbed network namespace: {comm(p)}" for p in sorted(netns_pids())]
    found += [f"process {p} connected to a testbed address: {comm(p)}"
              for p in sorted(processes_connected_to_testbed())]
    found += [f"mount {m}" for m in testbed_mounts()]
    found += [f"network namespace {n}" for n in testbed_netns()]
    found += [f"link {n}" for n in testbed_links()]
    found += [f"cgroup {d}" for d in testbed_cgroup_dirs()]
    if STATE_ROOT.exists():
        found.append(f"state directory {STATE_ROOT}")
    found += [f"generated file {p}" for p in (INVENTORY, STATE_JSON) if p.exists()]
    return found


def testbed_socket_inodes() -> set[str]:
    """Inodes of the machine's TCP sockets connected to a testbed address (root network namespace)."""
    inodes = set()
    prefix = "".join(f"{int(octet):02X}" for octet in reversed(PREFIX.split(".")))  # /proc/net/tcp byte order
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:  # the testbed is IPv4 only
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if remote[2:8] == prefix and state != "0A" and inode != "0":  # 0A: listening
            inodes.add(inode)
    return inodes


def processes_connected_to_testbed() -> set[int]:
    """Machine processes (e.g. ssh ControlPersist masters) holding a TCP connection to a testbed host."""
    inodes = testbed_socket_inodes()
    if not inodes:
        return set()
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    pids.add(int(proc.name))
                    break
    return pids


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except FileNotFoundError:
        return "(gone)"


def current_state() -> State:
    state = load_journal()
    if state is None:
        raise TestbedError("no testbed is up: run `testbed.py up` first")
    return state


def exec_in(host: str, argv: Sequence[str], pid: int | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run argv inside a host (all its namespaces) and return the CompletedProcess (text, output captured)."""
    if pid is None:
        pid = current_state().host(host).pid
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    kw.setdefault("text", True)
    kw.setdefault("start_new_session", True)  # its own process group: a `kill 0` inside never reaches the caller
    return subprocess.run(["nsenter", "-t", str(pid), "-a", "--", *argv], **kw)


def status_rows(state: State) -> list[list[str]]:
    rows = [["host", "address", "systemd", "pid", "memory"]]
    for host in state.hosts:
        rows.append([host.name, host.address, system_state(host), str(host.pid), mib(memory_usage(host.name))])
    return rows


def print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


# --- packages -------------------------------------------------------------------------------------------------

def missing_packages(packages: list[str]) -> list[str]:
    out = run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Abbrev}\n", *packages], check=False).stdout
    installed = {line.split()[0] for line in out.splitlines() if len(line.split()) > 1 and line.split()[1] == "ii"}
    return [p for p in packages if p not in installed]


def install_packages() -> list[str]:
    """Install what hosts need with scripts/setup-system (which starts no service on the machine)."""
    require_root()
    missing = missing_packages(PACKAGES)
    if missing:
        run([str(REPO_ROOT / "scripts" / "setup-system")], stdout=None, stderr=None)
    return missing


# --- command line ---------------------------------------------------------------------------------------------

def cmd_up(args: argparse.Namespace) -> int:
    already = load_journal() is not None
    state = up(args.nodes, args.slurm, args.keep_on_failure)
    if already:
        print(f"testbed already up with {state.nodes} hosts (slurm {'on' if state.slurm else 'off'}): healthy")
    else:
        print(f"booted {state.nodes} hosts (slurm {'on' if state.slurm else 'off'}) in {state.boot_seconds:.2f} s")
        print("  " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in state.phases.items()))
    print_table(status_rows(state))
    print(f"inventory: {INVENTORY}")
    return 0


def cmd_down(_: argparse.Namespace) -> int:
    seconds = down()
    print(f"testbed down in {seconds:.2f} s")
    return 0


def cmd_status(_: argparse.Namespace) -> int:
    state = load_journal()
    if state is None:
        print("no testbed is up")
        return 1
    print(f"{state.nodes} hosts, slurm {'on' if state.slurm else 'off'}")
    print_table(status_rows(state))
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise TestbedError("usage: testbed.py exec HOST -- CMD...")
    pid = current_state().host(args.host).pid
    os.execvp("nsenter", ["nsenter", "-t", str(pid), "-a", "--", *argv])
    return 127  # not reached


def cmd_leaks(_: argparse.Namespace) -> int:
    found = leaks()
    for item in found:
        print(item)
    if not found:
        print("no leaks")
    return 1 if found else 0


def cmd_install(_: argparse.Namespace) -> int:
    installed = install_packages()
    print(f"installed: {' '.join(installed)}" if installed else "all packages already installed")
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="testbed.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install-packages", help="apt-get install what the hosts need").set_defaults(func=cmd_install)
    p_up = sub.add_parser("up", help="boot the hosts (or check a running testbed)")
    p_up.add_argument("--nodes", type=int, default=3, help=f"number of hosts, 1..{MAX_NODES} (default 3)")
    p_up.add_argument("--slurm", action="store_true", help="munge + slurmctld on node0 + slurmd everywhere")
    p_up.add_argument("--keep-on-failure", action="store_true", help="leave a failed boot in place to debug")
    p_up.set_defaults(func=cmd_up)
    sub.add_parser("down", help="remove every trace of the testbed").set_defaults(func=cmd_down)
    sub.add_parser("status", help="one line per host").set_defaults(func=cmd_status)
    p_exec = sub.add_parser("exec", help="run a command inside a host: exec HOST -- CMD...")
    p_exec.add_argument("host")
    p_exec.add_argument("argv", nargs=argparse.REMAINDER)
    p_exec.set_defaults(func=cmd_exec)
    sub.add_parser("leaks", help="list what the testbed left on the machine; exit 1 if anything").set_defaults(
        func=cmd_leaks)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return args.func(args)
    except TestbedError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `testbed.py up | head -1`: the work is done, only the output was cut
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
