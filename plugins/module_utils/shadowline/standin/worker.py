"""The real Dynamo worker a stand-in leader runs once it is primary: ``dynamo.mocker``.

It registers only after the leader holds the failover lock, so nothing is in discovery before that
(as a shadow upstream registers only after waking). A parked shadow pre-starts it (``prewarm``: the
process imports the mocker, makes its Dynamo runtime, connected to etcd and NATS as a real parked
shadow's is, and waits, see worker_launcher) so that waking costs no Python start-up and no
connection; ``SHADOWLINE_STANDIN_PREWARM=0`` starts it only at wake instead. It runs in the
leader's process group, holds the lock descriptor (inherited, or passed at wake by SCM_RIGHTS),
and has PR_SET_PDEATHSIG(SIGKILL): killing the leader kills it and releases the lock, and
``kill -STOP -<pgid>`` freezes both. Every listener it opens is on the engine's host address: its
system port (a free port in 20000-28999 there, which also serves the model card files the
frontend downloads), its TCP request plane; events go through NATS instead of ZMQ (which would
bind 0.0.0.0).
"""

from __future__ import annotations

import base64
import ctypes
import http.client
import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from ..common.http import fetch, open_direct
from ..common.proc import TCP_ESTABLISHED, TCP_LISTEN, listening_ports, socket_inodes, tcp_sockets
from . import unix_messages

log = logging.getLogger("shadowline.standin.worker")

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


# Dynamo parses DYN_SYSTEM_PORT as a signed 16-bit number, so the kernel's ephemeral ports (32768
# and up) are refused; the worker's port is drawn from this range instead (clear of the reference
# port plan: 8000, 8080+, 8280+, 29500+, 2379/2380, 4222/8222).
WORKER_PORT_RANGE = (20000, 28999)


def free_port(host: str, low: int = WORKER_PORT_RANGE[0], high: int = WORKER_PORT_RANGE[1]) -> int:
    """A port in [low, high] that is free on ``host`` right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    rng = random.SystemRandom()
    for _unused in range(200):
        port = rng.randint(low, high)
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {low}-{high} on {host}")


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def http_get(url: str, timeout: float) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) through the library's one HTTP GET (common/http.py); OSError when nothing
    answered (the stand-in's callers treat that as a worker that is not up)."""
    answer = fetch(url, timeout)
    if answer is None:
        raise OSError(f"{url} did not answer within {timeout} s")
    return answer.status, answer.headers, answer.body


def etcd_has_key_suffix(endpoints: str, prefix: str, suffix: str, timeout: float = 1.0) -> bool | None:
    """Whether etcd has a key under ``prefix`` ending in ``suffix`` (v3 JSON gateway); None if unknown."""
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps({"key": b64(prefix), "range_end": b64(end), "keys_only": True}).encode()
    for ep in [e.strip().rstrip("/") for e in endpoints.split(",") if e.strip()]:
        if "://" not in ep:
            ep = "http://" + ep
        req = urllib.request.Request(ep + "/v3/kv/range", data=body, headers={"Content-Type": "application/json"})
        try:
            with open_direct(req, timeout) as r:
                kvs = json.load(r).get("kvs", [])
        except (OSError, ValueError, http.client.HTTPException):
            # not readable anonymously: etcd with authentication refuses it, and through the host's etcd proxy
            # (gRPC only: ALPN h2) etcd answers an HTTP/1.1 request with HTTP/2 frames (BadStatusLine) or nothing
            continue
        return any(base64.b64decode(kv["key"]).decode().endswith(suffix) for kv in kvs)
    return None


def connections_with_unread_bytes(rows: list[list[str]], inodes: set[str]) -> int:
    """How many of the process's established connections to one of its own listening ports have bytes waiting in
    the receive queue, from /proc/net/tcp's rows split in fields (proc.tcp_sockets) and the process's socket
    inodes (proc.socket_inodes)."""
    owned = [f for f in rows if len(f) > 9 and f[9] in inodes]
    listening = {f[1].rsplit(":", 1)[1] for f in owned if f[3] == TCP_LISTEN}
    return sum(1 for f in owned if f[3] == TCP_ESTABLISHED and f[1].rsplit(":", 1)[1] in listening
               and int(f[4].split(":")[1], 16) > 0)


class Worker:
    def __init__(self, model_dir: str, served_model_name: str, host: str) -> None:
        self.model_dir, self.name, self.host = model_dir, served_model_name, host
        self.lock_fd = -1
        self.proc: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self.port = 0
        self.worker_id: str | None = None
        self.frozen = False
        self._mutex = threading.Lock()

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "DYN_SYSTEM_HOST": self.host,
            "DYN_SYSTEM_PORT": str(self.port),
            "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS": '["generate"]',
        })
        env.setdefault("DYN_TCP_RPC_HOST", self.host)
        env.setdefault("DYN_EVENT_PLANE", "nats")  # zmq would bind 0.0.0.0
        env.setdefault("HF_HUB_OFFLINE", "1")
        return env

    def _pick_port(self) -> None:
        low, high = WORKER_PORT_RANGE
        raw = os.environ.get("SHADOWLINE_STANDIN_WORKER_PORT_RANGE", "")
        if raw:
            low, high = (int(x) for x in raw.split("-", 1))
        self.port = free_port(self.host, low, high)

    def _spawn(self, argv: list[str], pass_fds: tuple[int, ...]) -> subprocess.Popen:
        parent = os.getpid()

        def in_child() -> None:  # between fork and exec: die with the leader
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(1)

        return subprocess.Popen(argv, env=self._env(), pass_fds=pass_fds, preexec_fn=in_child)

    def mocker_args(self) -> list[str]:
        return ["--model-path", self.model_dir, "--model-name", self.name]

    def prewarm(self) -> None:
        """Start the worker process now, parked before it registers anything (see worker_launcher)."""
        self._pick_port()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = self._spawn([sys.executable, "-m", "shadowline.standin.worker_launcher",
                                     str(theirs.fileno()), *self.mocker_args()], (theirs.fileno(),))
        finally:
            theirs.close()
        self._control = ours
        log.info("worker: pre-started dynamo.mocker pid %d, parked until this engine holds the lock", self.proc.pid)
        pid = self.proc.pid

        def report_warm() -> None:
            try:
                if unix_messages.recv(ours)[0].get("warm"):
                    log.info("worker: pre-started dynamo.mocker pid %d is warm", pid)
            except (unix_messages.ConnectionClosed, OSError, ValueError):
                pass

        threading.Thread(target=report_warm, name="worker-warm", daemon=True).start()

    def start(self, lock_fd: int) -> None:
        """Run the worker: release the pre-started one, or start one now."""
        self.lock_fd = lock_fd
        fds = (lock_fd,) if lock_fd >= 0 else ()
        if self._control is not None:
            if self.proc is not None and self.proc.poll() is None and self.port_ours_or_free():
                unix_messages.send(self._control, {"argv": self.mocker_args()}, fds)
                self._control.close()
                self._control = None
                log.info("worker: started dynamo.mocker pid %d (system port %s:%d, model %s)", self.proc.pid,
                         self.host, self.port, self.name)
                return
            log.warning("worker: the pre-started worker died or its port %d was taken; starting a new one", self.port)
            self.discard()
        self._pick_port()
        self.proc = self._spawn([sys.executable, "-m", "dynamo.mocker", *self.mocker_args()], fds)
        log.info("worker: started dynamo.mocker pid %d (system port %s:%d, model %s)", self.proc.pid, self.host,
                 self.port, self.name)

    def port_ours_or_free(self) -> bool:
        """The pre-started worker's system port: free, or already its own (its runtime, made while parked, serves
        it); False when another process took it meanwhile."""
        if port_free(self.host, self.port):
            return True
        return self.proc is not None and self.port in listening_ports([self.proc.pid])

    def discard(self) -> None:
        """Drop a pre-started worker that never ran."""
        if self._control is not None:
            self._control.close()
            self._control = None
        if self.proc is not None:
            self.signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def wait_registered(self, timeout: float, stop: threading.Event) -> bool:
        """Until the worker's generate endpoint is ready and its model card is in discovery."""
        if not (self.proc is not None):
            raise AssertionError("unreachable: checked above")
        deadline = time.monotonic() + timeout
        etcd = os.environ.get("ETCD_ENDPOINTS", "")
        phase = "health"
        while time.monotonic() < deadline and not stop.is_set():
            if self.proc.poll() is not None:
                log.error("worker: dynamo.mocker exited with %s before it registered", self.proc.returncode)
                return False
            try:
                if phase == "health":
                    status, _unused, body = http_get(self.base_url + "/health", 0.5)
                    if status == 200 and json.loads(body).get("endpoints", {}).get("generate") == "ready":
                        phase = "metrics"
                if phase == "metrics":
                    _status, _headers, body = http_get(self.base_url + "/metrics", 0.5)
                    m = re.search(rb'dynamo_endpoint="generate"[^}]*worker_id="([0-9a-f]+)"', body)
                    if m:
                        self.worker_id = m.group(1).decode()
                        phase = "discovery"
                if phase == "discovery":
                    if not etcd:
                        return True
                    found = etcd_has_key_suffix(etcd, "v1/mdc/", "/" + self.worker_id)
                    if found is None:
                        log.warning("worker: etcd at %s not readable; taking a ready endpoint as registered", etcd)
                        return True
                    if found:
                        return True
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        return False

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def requests_waiting(self) -> int:
        """Connections to the worker's listening ports (its request plane) holding bytes it has not read: requests
        that arrived while it is frozen, which a real engine's live Dynamo runtime would have taken in. 0 when its
        sockets cannot be read."""
        if self.proc is None:
            return 0
        return connections_with_unread_bytes(tcp_sockets(), socket_inodes(self.proc.pid))

    def freeze(self, why: str) -> None:
        with self._mutex:
            if self.proc is not None and not self.frozen:
                self.signal(signal.SIGSTOP)
                self.frozen = True
                log.warning("worker: frozen (SIGSTOP) because %s", why)

    def thaw(self) -> None:
        with self._mutex:
            if self.proc is not None and self.frozen:
                self.signal(signal.SIGCONT)
                self.frozen = False
                log.warning("worker: resumed (SIGCONT)")

    def stop(self, grace: float = 5.0) -> None:
        if self._control is not None:
            self.discard()
            return
        if self.proc is None or self.proc.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()
        log.info("worker: dynamo.mocker stopped (exit %s)", self.proc.returncode)
