"""Process control for engine ranks: the processes of a systemd unit (its cgroup), killing them all at once,
and waiting for exits without being their parent (pidfd); and every read of /proc (a process's state, start
time, command line, sockets, cgroup and environment; the listening TCP sockets; the mounts), in one place.

Engine units run with KillMode=control-group, so a rank is "gone" when its unit's cgroup has no process.
Killing through the cgroup reaches every process of the rank (the stand-in's worker, vLLM's workers),
whoever their parent is, in well under a millisecond per process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass

CGROUP_ROOTS = ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")


def unit_properties(unit: str, *names: str) -> dict[str, str]:
    """Properties of a systemd unit (``systemctl show``); empty when systemctl does not answer."""
    try:
        out = subprocess.run(["systemctl", "show", unit, f"--property={','.join(names)}"],
                             capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def monotonic_to_unix(usec: str) -> float | None:
    """A systemd ``...TimestampMonotonic`` value (microseconds since boot) as unix time; None when unset."""
    mono = int(usec or 0)
    return time.time() - (time.monotonic() - mono / 1e6) if mono else None


def unit_cgroup(unit: str) -> str | None:
    """The unit's cgroup path relative to the hierarchy root, e.g. /system.slice/x.service."""
    return unit_properties(unit, "ControlGroup").get("ControlGroup") or None


def cgroup_pids(cgroup: str) -> list[int]:
    """Every process in the cgroup and its children, from the first hierarchy that has it."""
    for root in CGROUP_ROOTS:
        top = root + cgroup
        if not os.path.isdir(top):
            continue
        pids: list[int] = []
        for dirpath, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    with open(os.path.join(dirpath, "cgroup.procs"), encoding="ascii") as handle:
                        pids += [int(line) for line in handle if line.strip()]
                except OSError:
                    continue
        return pids
    return []


PAYLOAD_CGROUP = "libpod-payload-"  # podman --cgroups split: the container's processes, in a child of the unit's cgroup


def container_main_pid(cgroup: str | None) -> int | None:
    """In a container unit (python_env_mode container), the container's first process: the one that runs the plan's
    argv, whose parent (conmon) is outside the payload's cgroup. None for any other unit or when it is gone."""
    if not cgroup:
        return None
    for root in CGROUP_ROOTS:
        try:
            children = [d for d in os.listdir(root + cgroup) if d.startswith(PAYLOAD_CGROUP)]
        except OSError:
            continue
        members = set(cgroup_pids(f"{cgroup}/{children[0]}")) if children else set()
        for pid in sorted(members):
            stat = proc_stat(pid)
            if stat is not None and stat.parent not in members:
                return pid
        return None
    return None


def argv_process(props: dict[str, str], container: bool | None = None) -> int:
    """The process of a unit that runs the plan's argv, from its ``MainPID`` and ``ControlGroup`` properties: in a
    container unit (``container`` True) the container's first process, 0 while podman has not started it; in any
    other unit (False) MainPID. ``container`` None (a reader without the plan): the container's first process
    where the unit has one, else MainPID. 0 when there is none."""
    main = int(props.get("MainPID", "0") or 0)
    if container is False:
        return main
    payload = container_main_pid(props.get("ControlGroup")) or 0
    return payload if container else (payload or main)


def kill_cgroup(cgroup: str, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to every process of the cgroup; returns how many were signalled."""
    count = 0
    for pid in cgroup_pids(cgroup):
        try:
            os.kill(pid, sig)
            count += 1
        except ProcessLookupError:
            pass
    return count


CGROUP2_ROOTS = CGROUP_ROOTS[1:]  # the unified hierarchies of CGROUP_ROOTS: systemd's hybrid layout, then cgroup v2's


def cgroup_events(cgroup: str) -> int | None:
    """A descriptor of the cgroup's ``cgroup.events`` (cgroup v2, its unified hierarchy), which poll() reports
    (POLLPRI) when a value in it changes, such as ``populated`` going to 0 as the last process of the cgroup
    and its children ends; None without one (cgroup v1 alone, or the cgroup is gone). Read it (cgroup_populated)
    before each wait: a read arms the next report."""
    for root in CGROUP2_ROOTS:
        try:
            return os.open(f"{root}{cgroup}/cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
    return None


def cgroup_populated(events: int) -> bool | None:
    """Does the cgroup of a ``cgroup.events`` descriptor (cgroup_events) still hold a process? None when it
    cannot say: the cgroup was removed (its descriptor is no use any more)."""
    try:
        text = os.pread(events, 256, 0).decode("ascii", "replace")
    except OSError:
        return None
    return "populated 1" in text.splitlines()


def pidfd_open(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (None if it is already gone)."""
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def systemctl(*args: str, timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=timeout, check=False)


# --- /proc ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcStat:
    """Fields of /proc/<pid>/stat: the state letter (R, S, D, T stopped, Z zombie, ...) and the start time in
    clock ticks since boot (with the pid, it names a process: a pid the kernel reused has another start)."""
    state: str
    process_group: int
    start_ticks: int
    parent: int = 0


def proc_stat(pid: int) -> ProcStat | None:
    """The process's stat fields, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 on
    return ProcStat(state=fields[0], process_group=int(fields[2]), start_ticks=int(fields[19]), parent=int(fields[1]))


def start_ticks(pid: int) -> int | None:
    """The process's start time (field 22 of /proc/<pid>/stat), None when it is gone."""
    stat = proc_stat(pid)
    return stat.start_ticks if stat else None


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP: state T; traced: t): it cannot act on a signal until resumed."""
    stat = proc_stat(pid)
    return bool(stat and stat.state in ("T", "t"))


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    members = []
    for pid in pids():
        stat = proc_stat(pid)
        if stat is not None and stat.state != "Z" and stat.process_group == pgid:
            members.append(pid)
    return members


def running(pid: int) -> bool:
    """The process exists and is not a zombie (unlike ``alive``, which a zombie still is)."""
    stat = proc_stat(pid)
    return bool(stat and stat.state != "Z")


def command_line(pid: int) -> list[str]:
    """The process's argv ([] when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [part.decode("utf-8", "replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def process_name(pid: int) -> str | None:
    """/proc/<pid>/comm."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def process_cgroup(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def process_environ(pid: int) -> list[bytes]:
    """The process's environment as ``KEY=VALUE`` byte strings ([] when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return []


def pids() -> list[int]:
    """Every process of the node (of this pid namespace)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets the process has open (same user or root)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    inodes = set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


@dataclass(frozen=True)
class Listener:
    port: int
    address: str
    inode: str


TCP_ESTABLISHED, TCP_LISTEN = "01", "0A"  # /proc/net/tcp's st field


def tcp_sockets() -> list[list[str]]:
    """The fields of every TCP socket (IPv4 and IPv6) of the node's network namespace, from /proc/net/tcp{,6}:
    ``sl local_address rem_address st tx_queue:rx_queue tr:when retrnsmt uid timeout inode ...``."""
    rows = []
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path, encoding="ascii") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        rows += [fields for fields in (line.split() for line in lines) if len(fields) > 9]
    return rows


def tcp_listeners() -> list[Listener]:
    """Every TCP socket in LISTEN state (IPv4 and IPv6) of the node's network namespace."""
    found = []
    for fields in tcp_sockets():
        if fields[3] == TCP_LISTEN:
            address_hex, port_hex = fields[1].rsplit(":", 1)
            found.append(Listener(int(port_hex, 16), _decode_address(address_hex), fields[9]))
    return found


def _decode_address(hexaddr: str) -> str:
    if len(hexaddr) == 8:
        return ".".join(str(b) for b in bytes.fromhex(hexaddr)[::-1])
    words = [bytes.fromhex(hexaddr[i:i + 8])[::-1].hex() for i in range(0, 32, 8)]
    joined = "".join(words)
    return ":".join(joined[i:i + 4] for i in range(0, 32, 4))


def listening_ports(of_pids: Iterable[int]) -> set[int]:
    """TCP ports in LISTEN state whose socket is open in one of ``of_pids``."""
    inodes: set[str] = set()
    for pid in of_pids:
        inodes |= socket_inodes(pid)
    return {listener.port for listener in tcp_listeners() if listener.inode in inodes}


@dataclass(frozen=True)
class Mount:
    mountpoint: str
    fstype: str
    options: tuple[str, ...]


def mounts() -> list[Mount]:
    """The mounts this process sees (/proc/self/mountinfo)."""
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    for line in lines:
        left, _unused, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or not tail:
            continue
        found.append(Mount(mountpoint=fields[4].replace("\\040", " "), fstype=tail[0],
                           options=tuple(fields[5].split(","))))
    return found
