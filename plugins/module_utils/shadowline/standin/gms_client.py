"""Client side of the stand-in GMS: publish a shard, import one, ask status, notice a lost server."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from . import unix_messages
from .weights import Shard

log = logging.getLogger("shadowline.standin.gms")


class GMSError(RuntimeError):
    """A GMS request failed; the message says why in words an operator can act on."""


def connect(path: str, timeout: float) -> socket.socket:
    """Connect, retrying while the server is not (yet) there, up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except (FileNotFoundError, ConnectionRefusedError) as e:
            s.close()
            last = e
        if time.monotonic() >= deadline:
            raise GMSError(f"GMS server unreachable at {path} for {timeout:.0f} s ({last}); "
                           "is the GMS server running on this node with the same GMS_SOCKET_DIR?")
        time.sleep(0.1)


def _request(sock: socket.socket, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()
             ) -> tuple[dict[str, Any], list[int]]:
    try:
        unix_messages.send(sock, message, fds)
        return unix_messages.recv(sock)
    except (unix_messages.ConnectionClosed, ConnectionError) as e:
        raise GMSError(f"GMS server closed the connection during {message.get('op')!r}: {e}") from e


def status(path: str, timeout: float = 1.0) -> dict[str, Any]:
    with connect(path, timeout) as s:
        reply, _unused = _request(s, {"op": "status"})
    return reply


def publish(path: str, shard: Shard, timeout: float) -> tuple[socket.socket, int]:
    """Commit ``shard`` as the socket's layout; returns the (kept open) session and generation."""
    s = connect(path, timeout)
    reply, _unused = _request(s, {"op": "publish", "header": shard.header}, [shard.fd])
    if not reply.get("ok"):
        s.close()
        raise GMSError(f"GMS publish to {path} failed: {reply.get('error')}")
    return s, int(reply["generation"])


def import_layout(path: str, expect: dict[str, Any], timeout: float, wait: float
                  ) -> tuple[dict[str, Any], int, socket.socket] | None:
    """Committed layout of a weights socket: (header, memfd, session). The caller maps the memfd.

    Waits up to ``timeout`` for the server, then up to ``wait`` (within ``timeout``) for a writer
    to commit a layout. None when there is no layout after that (the caller decides whether that
    is an error); raises GMSError when the server is unreachable or its layout is not the one
    expected.
    """
    started = time.monotonic()
    s = connect(path, timeout)
    remaining = max(0.0, min(wait, timeout - (time.monotonic() - started)))
    reply, fds = _request(s, {"op": "import", "expect": expect, "timeout": remaining})
    if not reply.get("ok"):
        s.close()
        for fd in fds:
            os.close(fd)
        if reply.get("empty"):
            return None
        raise GMSError(str(reply.get("error")))
    if len(fds) != 1:
        s.close()
        for fd in fds:
            os.close(fd)
        raise GMSError(f"GMS import from {path}: expected one descriptor, got {len(fds)}")
    return reply["header"], fds[0], s


def watch(session: socket.socket, path: str, on_lost: Callable[[str], None]) -> threading.Thread:
    """Call ``on_lost(path)`` from a daemon thread when the server side of ``session`` goes away."""

    def run() -> None:
        try:
            while session.recv(4096):
                pass
        except OSError:
            pass
        on_lost(path)

    t = threading.Thread(target=run, name=f"gms-watch-{os.path.basename(path)}", daemon=True)
    t.start()
    return t
