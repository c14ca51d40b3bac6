"""Small helpers: running a command, waiting for a condition, looking at a process."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

from .errors import TestbedError


def run(argv: Sequence[str], check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    proc = subprocess.run(list(argv), text=True, check=False, **kw)
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


def mib(n_bytes: int | None) -> str:
    return "-" if n_bytes is None else f"{n_bytes / 2**20:.1f} MiB"


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except FileNotFoundError:
        return "(gone)"
