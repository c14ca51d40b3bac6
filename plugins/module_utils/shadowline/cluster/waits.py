"""Bounded polling for readiness: an HTTP status, a number of files, ports that accept, a lock holder. One loop for
all."""

from __future__ import annotations

import glob
import socket
import ssl
import time
from typing import Callable

from ..common.http import http_get
from .cohort_state import lock_holder


def poll(check: Callable[[], str | None], timeout_s: float, interval_s: float = 0.1,
         hopeless: Callable[[], bool] | None = None) -> tuple[bool, float, str]:
    """Call ``check`` until it returns None (ready) or the timeout passes, or ``hopeless`` (asked after a check
    that was not ready) says readiness cannot come any more (the process that would answer has ended).

    ``check`` returns None when ready, else a short description of what it saw. Returns
    (ready, seconds waited, last description).
    """
    start = time.monotonic()
    seen = "not checked"
    while True:
        result = check()
        waited = time.monotonic() - start
        if result is None:
            return True, waited, "ready"
        seen = result
        if waited >= timeout_s or (hopeless is not None and hopeless()):
            return False, waited, seen
        time.sleep(interval_s)


def every(period_s: float, ask: Callable[[], bool]) -> Callable[[], bool]:
    """``ask``, called at most once every ``period_s`` (False in between): for a question that costs a process."""
    last = [-period_s]

    def asked() -> bool:
        now = time.monotonic()
        if now - last[0] < period_s:
            return False
        last[0] = now
        return ask()
    return asked


def http_check(url: str, status: int = 200, timeout_s: float = 1.0,
               context: ssl.SSLContext | None = None) -> Callable[[], str | None]:
    def check() -> str | None:
        answer = http_get(url, timeout_s, context)
        if answer is None:
            return f"{url} did not answer"
        return None if answer[0] == status else f"{url} answered {answer[0]}"
    return check


def files_check(pattern: str, count: int) -> Callable[[], str | None]:
    def check() -> str | None:
        found = len(glob.glob(pattern))
        return None if found >= count else f"{found} of {count} files matching {pattern}"
    return check


def listening_check(host: str, ports: list[int]) -> Callable[[], str | None]:
    """Ready when each of ``ports`` of ``host`` accepts a TCP connection (closed at once)."""
    def check() -> str | None:
        refused = []
        for port in ports:
            try:
                socket.create_connection((host, port), timeout=0.5).close()
            except OSError:
                refused.append(str(port))
        return f"{host} refused port(s) {', '.join(refused)}" if refused else None
    return check


def holder_check(lock_path: str, holder: str | None = None) -> Callable[[], str | None]:
    """Ready when some process holds the lock (and, if given, it is ``holder``, e.g. engine-1)."""
    def check() -> str | None:
        current = lock_holder(lock_path)
        if current is None:
            return f"nobody holds {lock_path}"
        if holder is not None and current != holder:
            return f"{lock_path} is held by {current}, not {holder}"
        return None
    return check
