"""Framed JSON messages over a unix stream socket, optionally carrying file descriptors.

Frame: 4-byte big-endian length, then that many bytes of UTF-8 JSON. Descriptors travel as
SCM_RIGHTS ancillary data on the same ``sendmsg`` as the frame, so the receiver gets them with the
frame's first bytes.
"""

from __future__ import annotations

import array
import json
import socket
import struct
from typing import Any

MAX_FDS = 16
MAX_FRAME = 64 * 1024 * 1024


class ConnectionClosed(EOFError):
    """The peer closed the connection (or died)."""


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    frame = struct.pack(">I", len(body)) + body
    if fds:
        sent = sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        if sent < len(frame):
            sock.sendall(frame[sent:])
    else:
        sock.sendall(frame)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            raise ConnectionClosed("connection closed by peer")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Next message and the descriptors that came with it (the caller owns and closes them)."""
    fds: list[int] = []
    head = b""
    while len(head) < 4:
        data, ancdata, _flags, _addr = sock.recvmsg(4 - len(head), socket.CMSG_SPACE(MAX_FDS * 4))
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                arr = array.array("i")
                arr.frombytes(payload[: len(payload) - len(payload) % arr.itemsize])
                fds.extend(arr)
        if not data:
            raise ConnectionClosed("connection closed by peer")
        head += data
    (length,) = struct.unpack(">I", head)
    if length > MAX_FRAME:
        raise ValueError(f"frame of {length} bytes is too large")
    return json.loads(_recv_exact(sock, length)), fds
