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
