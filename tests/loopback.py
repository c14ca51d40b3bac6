"""Loopback helpers shared by the stand-in, Slurm and library tests: free ports, a bounded wait, a local etcd, a
proxy that cuts etcd's answers short.

Everything listens on 127.0.0.1. ``start_etcd`` runs etcd in its own session and ``LocalEtcd.stop`` kills its
whole process group; tests that track processes themselves (tests/standin/harness.py's ``Procs``) start
``etcd_argv`` their own way and wait with ``wait_healthy``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, TypeVar

HOST = "127.0.0.1"
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_until(fn: Callable[[], T], timeout: float, interval: float = 0.02, what: str = "condition") -> T:
    """``fn()``'s first truthy value, polled every ``interval`` s; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def http_status(url: str, timeout: float = 1.0) -> int:
    """The HTTP status of a GET, 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback test URLs)
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def etcd_argv(name: str, data_dir: Path) -> tuple[list[str], str]:
    """The command of a one-member etcd on two free loopback ports, and its client URL."""
    client, peer = free_port(), free_port()
    return [
        ETCD, "--name", name, "--data-dir", str(data_dir),
        "--listen-client-urls", f"http://{HOST}:{client}", "--advertise-client-urls", f"http://{HOST}:{client}",
        "--listen-peer-urls", f"http://{HOST}:{peer}", "--initial-advertise-peer-urls", f"http://{HOST}:{peer}",
        "--initial-cluster", f"{name}=http://{HOST}:{peer}",
    ], f"http://{HOST}:{client}"


def wait_healthy(url: str, timeout: float = 20, what: str = "etcd") -> None:
    wait_until(lambda: http_status(f"{url}/health") == 200, timeout, what=f"{what} /health")


def start_server(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A server in a session of its own (stop_server ends its whole group), its output in ``log``; its environment
    PATH and ``env`` alone."""
    with open(log, "wb") as handle:
        return subprocess.Popen(list(argv), stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True,
                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})})


def stop_server(process: subprocess.Popen) -> None:
    """Kill the server's whole process group (continued first, in case a test stopped it) and reap it."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
    process.wait(10)


@dataclass
class LocalEtcd:
    url: str
    process: subprocess.Popen
    data_dir: Path

    def stop(self) -> None:
        stop_server(self.process)


def start_etcd(workdir: Path, name: str = "slurm-test", extra: Sequence[str] = ()) -> LocalEtcd:
    """A fresh etcd with its data and log (``etcd.log``) under ``workdir``, healthy when this returns; ``extra``:
    more of etcd's flags."""
    argv, url = etcd_argv(name, workdir / "etcd")
    etcd = LocalEtcd(url, start_server([*argv, *extra], workdir / "etcd.log"), workdir / "etcd")
    try:
        wait_healthy(url)
    except AssertionError:
        etcd.stop()
        raise
    return etcd


def read_request(client: socket.socket) -> bytes:
    """One whole HTTP request from ``client``: the headers, then Content-Length bytes of body. A single recv() may
    return the headers alone (http.client can send them apart from the body, and a loaded machine splits them):
    forwarded like that, etcd waits for the rest until the proxy's 5 s timeout (a CI failure of
    test_etcd_resilience)."""
    return _read_message(client, chunked_body=False)


def read_response(upstream: socket.socket) -> bytes:
    """One whole HTTP answer from ``upstream``: the headers, then Content-Length bytes of body or chunks up to the
    last (empty) one; what came when the connection ends first."""
    return _read_message(upstream, chunked_body=True)


def _read_message(sock: socket.socket, chunked_body: bool) -> bytes:
    """An HTTP message's headers and its body (Content-Length, or with ``chunked_body`` the chunked encoding)."""
    message = b""
    while b"\r\n\r\n" not in message:
        chunk = sock.recv(65536)
        if not chunk:
            return message
        message += chunk
    head, _sep, body = message.partition(b"\r\n\r\n")
    lines = [line.lower() for line in head.split(b"\r\n")[1:]]
    length = next((int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length:")), None)
    chunked = chunked_body and any(line.startswith(b"transfer-encoding:") and b"chunked" in line for line in lines)

    def whole() -> bool:
        if chunked:
            return body.endswith(b"0\r\n\r\n")
        if length is None:
            return not chunked_body  # a request without a body; an answer without a length ends with its connection
        return len(body) >= length

    while not whole():
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class CuttingProxy:
    """A TCP proxy to etcd that cuts every ``every``-th answer in half and closes the connection; with ``only``,
    just the answers to requests that contain it (e.g. ``b"/v3/kv/txn"``), the rest passed whole (``every=0``:
    none cut). A connection carries requests one after another (a client's kept-alive connection) until its client
    or etcd closes it, or after ``per_connection`` whole answers (a server that closes idle connections)."""

    def __init__(self, target: tuple[str, int], every: int, only: bytes | None = None,
                 per_connection: int = 0) -> None:
        self.target = target
        self.every = every
        self.only = only
        self.per_connection = per_connection
        self.count = 0
        self.connections = 0  # accepted so far
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                client, _unused = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.relay, args=(client,), daemon=True).start()

    def relay(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.target, timeout=5) as upstream:
            client.settimeout(5)
            answered = 0
            try:
                while request := read_request(client):
                    cut = False
                    if self.only is None or self.only in request:
                        self.count += 1
                        cut = bool(self.every) and self.count % self.every == 0
                    upstream.sendall(request)
                    answer = read_response(upstream)
                    if cut or not answer:
                        client.sendall(answer[: len(answer) // 2])
                        return
                    client.sendall(answer)
                    answered += 1
                    if answered == self.per_connection:
                        return  # closed while the client keeps it for its next request
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()
