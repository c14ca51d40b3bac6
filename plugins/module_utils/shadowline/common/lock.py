"""The failover lock: an flock on a file shared by the engines of one node.

Same semantics as Dynamo's ``FlockFailoverLock`` (Dynamo 1.6.1, ``dynamo.vllm``'s shadow mode):

- ``acquire`` polls ``flock(LOCK_EX | LOCK_NB)`` every 0.1 s; once it wins it truncates the file,
  writes ``engine-<id>`` (no newline) and keeps the descriptor open. The kernel releases the lock
  when every descriptor of that open file is closed, so a holder that dies (even by SIGKILL)
  releases it, and a hung holder keeps it forever.
- ``read_holder`` reads who last wrote the file (the holder, or the last holder if it died).
- ``is_locked`` probes with ``LOCK_SH | LOCK_NB`` on a descriptor of its own and drops the shared
  lock at once, so it never holds or steals the lock.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from dataclasses import dataclass, field

POLL_INTERVAL = 0.1


def holder_name(engine_id: str | int) -> str:
    """The text a holder writes into the lock file: ``engine-<id>``."""
    return f"engine-{engine_id}"


@dataclass
class FailoverLock:
    """An acquired lock. Closing ``fd`` (or the process dying) releases it."""

    path: str
    fd: int
    holder: str
    contended: bool  # the first attempt found it taken: winning it is a failover, not a bootup
    acquired_at: float = field(default_factory=time.time)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @property
    def held(self) -> bool:
        return self.fd >= 0


def try_acquire(path: str, engine_id: str | int) -> FailoverLock | None:
    """One non-blocking attempt; None when another descriptor holds the lock."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return _stamp(path, fd, engine_id, contended=False)


def acquire(
    path: str,
    engine_id: str | int,
    poll_interval: float = POLL_INTERVAL,
    stop: threading.Event | None = None,
    timeout: float | None = None,
) -> FailoverLock | None:
    """Poll until the lock is ours. None if ``stop`` is set or ``timeout`` passes first."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    contended = False
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                contended = True
            if (stop is not None and stop.is_set()) or (deadline is not None and time.monotonic() >= deadline):
                os.close(fd)
                return None
            if stop is not None:
                stop.wait(poll_interval)
            else:
                time.sleep(poll_interval)
    except BaseException:
        os.close(fd)
        raise
    return _stamp(path, fd, engine_id, contended)


def _stamp(path: str, fd: int, engine_id: str | int, contended: bool) -> FailoverLock:
    holder = holder_name(engine_id)
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, holder.encode())
    return FailoverLock(path=path, fd=fd, holder=holder, contended=contended)


def read_holder(path: str) -> str | None:
    """Content of the lock file (``engine-<id>``), None if missing or empty."""
    try:
        with open(path, encoding="utf-8") as f:
            content = f.read().strip()
    except FileNotFoundError:
        return None
    return content or None


def is_locked(path: str) -> bool:
    """True when some process holds the lock. Never creates the file, never keeps a lock."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def parse_holder(content: str) -> int | None:
    """The engine id in a lock file's content (``engine-<id>``), or None."""
    text = content.strip()
    prefix = holder_name("")
    if text.startswith(prefix) and text[len(prefix):].isdigit():
        return int(text[len(prefix):])
    return None
