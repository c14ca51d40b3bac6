"""Running a command inside a host (nsenter into all its namespaces)."""

from __future__ import annotations

import subprocess
from typing import Any, Sequence

from .errors import TestbedError
from .journal import State, load_journal


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
    return subprocess.run(["nsenter", "-t", str(pid), "-a", "--", *argv], check=kw.pop("check", False), **kw)


# A unit's main process, its CPU time (utime and stime: fields 12 and 13 after the command's closing parenthesis)
# before and after sleeping inside the host, with the host's clock ticks per second.
_UNIT_CPU = ('p=$(systemctl show -p MainPID --value "$1"); hz=$(getconf CLK_TCK); '
             'a=$(sed "s/.*) //" "/proc/$p/stat" | cut -d" " -f12,13); sleep "$2"; '
             'b=$(sed "s/.*) //" "/proc/$p/stat" | cut -d" " -f12,13); echo "$hz" $a $b')


def unit_cpu_cores(host: str, unit: str, seconds: float) -> float:
    """How many CPU cores a unit's main process used inside a host over ``seconds`` (measured there)."""
    proc = exec_in(host, ["sh", "-c", _UNIT_CPU, "sh", unit, str(seconds)], timeout=seconds + 30)
    values = proc.stdout.split()
    if proc.returncode != 0 or len(values) != 5:
        raise TestbedError(f"{host}: CPU time of {unit}'s main process: {proc.stdout.strip()} {proc.stderr.strip()}")
    hz, user_before, system_before, user_after, system_after = (int(v) for v in values)
    return (user_after + system_after - user_before - system_before) / hz / seconds
