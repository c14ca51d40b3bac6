"""Process control for engine ranks: the processes of a systemd unit (its cgroup), killing them all at once,
and waiting for exits without being their parent (pidfd).

Engine units run with KillMode=control-group, so a rank is "gone" when its unit's cgroup has no process.
Killing through the cgroup reaches every process of the rank (the stand-in's worker, vLLM's workers),
whoever their parent is, in well under a millisecond per process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

CGROUP_ROOTS = ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")


def unit_properties(unit: str, *names: str) -> dict[str, str]:
    """Properties of a systemd unit (``systemctl show``); empty when systemctl does not answer."""
    try:
        out = subprocess.run(["systemctl", "show", unit, f"--property={','.join(names)}"],
                             capture_output=True, text=True, timeout=10).stdout
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


def wait_cgroup_empty(cgroup: str, timeout_s: float, interval_s: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout_s
    while cgroup_pids(cgroup):
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True


def terminate_cgroup(cgroup: str, grace_s: float) -> bool:
    """SIGTERM, then SIGKILL after ``grace_s``; True when the cgroup is empty. A grace of 0 kills at once."""
    if grace_s > 0 and kill_cgroup(cgroup, signal.SIGTERM) and wait_cgroup_empty(cgroup, grace_s):
        return True
    for _ in range(50):  # processes forked while we killed: repeat until none is left
        if not kill_cgroup(cgroup, signal.SIGKILL):
            return True
        if wait_cgroup_empty(cgroup, 0.2):
            return True
    return not cgroup_pids(cgroup)


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


def systemctl(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=timeout)
