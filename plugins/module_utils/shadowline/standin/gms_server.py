"""Stand-in GPU Memory Service server: ``python -m shadowline.standin.gms_server``.

Same invocation shape as ``python -m gpu_memory_service.cli.server``: the socket directory comes
from ``GMS_SOCKET_DIR`` (default: the temp dir); the node's GPUs from ``SHADOWLINE_STANDIN_GPUS``
(comma-separated fake UUIDs) instead of NVML. It listens on one unix socket per (GPU, tag),
``gms_<GPU-UUID>_<tag>.sock`` for the tags ``weights`` and ``kv_cache``, and once all of them listen
it writes ``<GMS_SOCKET_DIR>/gms_ready`` (upstream writes no marker; its launch scripts wait for the
``gms_*_weights.sock`` files, which the stand-in also satisfies).

A ``weights`` socket holds at most one committed layout, like upstream's per-GPU server:

- ``publish``: a writer (an ``ENGINE_ID=0`` rank) sends its shard as a sealed memfd (SCM_RIGHTS)
  with a JSON header (model identity, TP size and rank, digest, tensor layout). The server keeps
  the descriptor. Like upstream's server, it refuses a new writer while readers are attached to a
  committed layout (another model revision needs a GMS server of its own: a residency); with none
  attached a new publish replaces the old layout.
- ``import``: a reader asks for the committed layout, waiting up to its timeout (upstream's
  admission wait) for a writer to publish; it gets the descriptor and maps it read-only.
- ``status``: what the socket holds.

Clients keep their connection open while they use the weights; when the server dies they see EOF
and log that their GMS connection was lost, while their mappings stay valid. A restarted server
starts empty: imports fail (after their timeout) until a writer publishes again. ``kv_cache``
sockets listen and answer ``status`` only (the stand-in does not model KV memory). SIGTERM and
SIGINT remove the sockets and the marker and exit 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import selectors
import signal
import socket
import threading
import time
from typing import Any

from ..common import console
from . import logs, settings, unix_messages

log = logging.getLogger("shadowline.standin.gms_server")


class Pool:
    """What one (GPU, tag) socket holds."""

    def __init__(self, gpu: str, tag: str, path: str) -> None:
        self.gpu, self.tag, self.path = gpu, tag, path
        self.cond = threading.Condition()
        self.header: dict[str, Any] | None = None
        self.fd = -1
        self.generation = 0
        self.clients = 0
        self.readers = 0  # connections holding an imported layout

    def publish(self, header: dict[str, Any], fd: int) -> int | str:
        """The new layout's generation, or why it was refused (readers attached to the committed one)."""
        with self.cond:
            if self.header is not None and self.readers > 0:
                os.close(fd)
                return (f"{self.readers} reader(s) attached to the committed layout (generation {self.generation}, "
                        f"model {self.header.get('model_path')}): the GMS server refuses a new writer while readers "
                        "are attached; give another model revision a GMS server of its own")
            if self.fd >= 0:
                os.close(self.fd)
            self.generation += 1
            self.header = {**header, "generation": self.generation, "published_at": time.time()}
            self.fd = fd
            self.cond.notify_all()
            return self.generation

    def wait_committed(self, timeout: float) -> tuple[dict[str, Any], int] | None:
        deadline = time.monotonic() + max(0.0, timeout)
        with self.cond:
            while self.header is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.cond.wait(remaining)
            return self.header, self.fd

    def status(self) -> dict[str, Any]:
        with self.cond:
            summary = None
            if self.header is not None:
                summary = {k: v for k, v in self.header.items() if k != "tensors"}
                summary["tensor_count"] = len(self.header.get("tensors", []))
            return {"gpu": self.gpu, "tag": self.tag, "committed": self.header is not None,
                    "generation": self.generation, "clients": self.clients, "readers": self.readers,
                    "layout": summary}


def mismatch(header: dict[str, Any], expect: dict[str, Any]) -> str | None:
    for key, want in expect.items():
        if header.get(key) != want:
            return f"{key}={header.get(key)!r} but the importer expects {want!r}"
    return None


def serve_client(pool: Pool, conn: socket.socket) -> None:
    with pool.cond:
        pool.clients += 1
    reading = False
    try:
        while True:
            msg, fds = unix_messages.recv(conn)
            op = msg.get("op")
            if op == "status":
                unix_messages.send(conn, {"ok": True, **pool.status()})
            elif op == "publish" and pool.tag == "weights" and len(fds) == 1:
                gen = pool.publish(msg["header"], fds[0])
                h = msg["header"]
                if isinstance(gen, str):
                    log.warning("GMS %s %s: refused a writer (engine-%s, model %s): %s", pool.gpu, pool.tag,
                                h.get("engine_id"), h.get("model_path"), gen)
                    unix_messages.send(conn, {"ok": False, "error": gen})
                    continue
                log.info("GMS %s %s: committed layout generation %d from engine-%s (model %s, TP rank %s/%s, "
                         "%d bytes, %s)", pool.gpu, pool.tag, gen, h.get("engine_id"), h.get("model"),
                         h.get("tp_rank"), h.get("tp_size"), h.get("size", 0), h.get("digest"))
                unix_messages.send(conn, {"ok": True, "generation": gen})
            elif op == "import" and pool.tag == "weights":
                got = pool.wait_committed(float(msg.get("timeout", settings.gms_timeout())))
                if got is None:
                    unix_messages.send(conn, {"ok": False, "empty": True, "error":
                                              f"no committed weights layout on {pool.path} (GMS state EMPTY): "
                                              "a writer (ENGINE_ID=0) must publish first"})
                    continue
                header, fd = got
                problem = mismatch(header, msg.get("expect", {}))
                if problem:
                    unix_messages.send(conn, {"ok": False, "error": f"committed layout on {pool.path} does not "
                                                                    f"match: {problem}"})
                    continue
                unix_messages.send(conn, {"ok": True, "header": header}, [fd])
                if not reading:
                    reading = True
                    with pool.cond:
                        pool.readers += 1
            else:
                for fd in fds:
                    os.close(fd)
                unix_messages.send(conn, {"ok": False, "error": f"unsupported request {op!r} on a {pool.tag} "
                                                                "socket of the stand-in GMS server"})
    except (unix_messages.ConnectionClosed, ConnectionError, OSError, ValueError):
        pass
    finally:
        with pool.cond:
            pool.clients -= 1
            pool.readers -= 1 if reading else 0
        conn.close()


def socket_alive(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def main(argv: list[str] | None = None) -> int:
    logs.setup("shadowline.standin.gms_server")
    parser = argparse.ArgumentParser(description="Stand-in GMS server (CPU, memfd-backed).")
    _args, unknown = parser.parse_known_args(argv)
    if unknown:
        log.info("ignoring arguments the stand-in does not use: %s", " ".join(unknown))
    gpus = settings.standin_gpus()
    if not gpus:
        console.err("error: SHADOWLINE_STANDIN_GPUS is empty: the stand-in GMS server needs the node's fake GPU UUIDs")
        return 2
    socket_dir = settings.gms_socket_dir()
    os.makedirs(socket_dir, exist_ok=True)
    marker = settings.gms_ready_marker(socket_dir)

    pools: dict[int, tuple[Pool, socket.socket]] = {}
    sel = selectors.DefaultSelector()
    for gpu in gpus:
        for tag in settings.GMS_TAGS:
            path = settings.gms_socket_path(gpu, tag, socket_dir)
            if socket_alive(path):
                console.err(f"error: another GMS server already serves {path}")
                return 1
            if os.path.exists(path):
                os.unlink(path)
            lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            lsock.bind(path)
            lsock.listen(64)
            lsock.setblocking(False)
            pools[lsock.fileno()] = (Pool(gpu, tag, path), lsock)
            sel.register(lsock, selectors.EVENT_READ)

    stopping = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:  # writes nothing: it may interrupt a write (watchdog.py)
        received.append(signum)
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    with open(marker + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"pid": os.getpid(), "gpus": gpus, "sockets": [p.path for p, _unused in pools.values()]}, f)
    os.rename(marker + ".tmp", marker)
    log.info("GMS stand-in ready: %d GPU(s) x %s, sockets in %s (pid %d)", len(gpus), "/".join(settings.GMS_TAGS),
             socket_dir, os.getpid())

    try:
        while not stopping.is_set():
            for key, _unused in sel.select(timeout=0.2):
                pool, lsock = pools[key.fd]
                try:
                    conn, _unused = lsock.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(True)
                threading.Thread(target=serve_client, args=(pool, conn), daemon=True).start()
    finally:
        if received:
            log.info("GMS stand-in: %s, shutting down", signal.Signals(received[0]).name)
        for pool, lsock in pools.values():
            lsock.close()
            try:
                os.unlink(pool.path)
            except FileNotFoundError:
                pass
        try:
            os.unlink(marker)
        except FileNotFoundError:
            pass
        log.info("GMS stand-in stopped; sockets removed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
