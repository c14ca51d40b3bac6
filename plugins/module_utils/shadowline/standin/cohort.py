"""The ranks of one engine: rendezvous on master-addr:master-port, then a heartbeat "collective".

Rendezvous: node-rank 0 listens on ``--master-addr`` only and waits for the ``nnodes - 1`` headless
ranks; each connects (retrying until it can), says hello (engine id, nnodes, TP size, its rank) and
is welcomed or rejected with the reason. The listener closes once the cohort is complete.

Collective: every ``SHADOWLINE_STANDIN_HEARTBEAT_INTERVAL`` (0.05 s) rank 0 sends step ``n`` to
every peer and waits for each to echo it, which stands for the NCCL collectives of a forward pass.
Each rank rewrites its heartbeat file ``heartbeat-engine-<id>-rank-<r>`` (content ``<step> <unix
time>``) at every step, and rank 0 counts steps for ``/metrics``, so a watchdog outside sees a stall.

A clean shutdown of rank 0 (SIGTERM) tells the headless ranks, which then exit 0. When a peer
dies or stalls, the others behave like NCCL: they stop progressing and wait, without
exiting (``SHADOWLINE_STANDIN_ON_PEER_DEATH=hang``, the default). With ``=exit`` a rank that sees
its peer's connection close exits non-zero (and, if ``SHADOWLINE_STANDIN_COLLECTIVE_TIMEOUT`` is
set, so does one whose collective stalled that long).

torch's NCCL watchdog is emulated from the same settings real ranks get (``--distributed-timeout-seconds``,
``TORCH_NCCL_ASYNC_ERROR_HANDLING``, ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC``; settings.nccl_watchdog): a rank whose
collective has waited longer than the timeout (on a stopped or dead peer, or stuck itself by the hang-collective
fault) logs ``Watchdog caught collective operation timeout`` and exits 4 dump waits later. A SIGSTOPped rank does
not (its watchdog is stopped too); the others do.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from .failover_metrics import render_family
from .settings import NcclWatchdog

log = logging.getLogger("shadowline.standin.cohort")


class CohortError(RuntimeError):
    pass


class PeerLost(ConnectionError):
    pass


class LineConn:
    """JSON lines over TCP, with a receive timeout that keeps partial input."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self._send_lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        try:
            with self._send_lock:
                self.sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError as e:
            raise PeerLost(str(e)) from e

    def recv(self, timeout: float | None = None) -> dict[str, Any]:
        """Next message; TimeoutError after ``timeout`` s, PeerLost when the connection ends."""
        while b"\n" not in self.buf:
            self.sock.settimeout(timeout)
            try:
                chunk = self.sock.recv(65536)
            except (socket.timeout, TimeoutError):
                raise TimeoutError from None
            except OSError as e:
                raise PeerLost(str(e)) from e
            if not chunk:
                raise PeerLost("connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        self.sock.close()


def rendezvous_leader(addr: str, port: int, hello: dict[str, Any], timeout: float) -> dict[int, LineConn]:
    """Rank 0: accept every headless rank of this engine; returns {rank: connection}."""
    nnodes = int(hello["nnodes"])
    try:
        lsock = socket.create_server((addr, port), family=socket.AF_INET6 if ":" in addr else socket.AF_INET)
    except OSError as e:
        raise CohortError(f"cannot listen on master address {addr}:{port}: {e}") from e
    log.info("rendezvous: listening on %s:%d for %d headless rank(s)", addr, port, nnodes - 1)
    peers: dict[int, LineConn] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(peers) < nnodes - 1:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(1, nnodes)) - set(peers))
                raise CohortError(f"rendezvous timed out after {timeout:.0f} s: node ranks {missing} never joined "
                                  f"{addr}:{port}")
            lsock.settimeout(remaining)
            try:
                sock, peer_addr = lsock.accept()
            except (socket.timeout, TimeoutError):
                continue
            conn = LineConn(sock)
            try:
                msg = conn.recv(timeout=10)
            except (TimeoutError, PeerLost, ValueError):
                conn.close()
                continue
            rank = msg.get("node_rank")
            problem = None
            for key in ("engine_id", "nnodes", "tp_size"):
                if msg.get(key) != hello[key]:
                    problem = f"{key} is {msg.get(key)!r} on the joining rank but {hello[key]!r} on rank 0"
                    break
            if problem is None and (not isinstance(rank, int) or not 1 <= rank < nnodes):
                problem = f"node rank {rank!r} is not in 1..{nnodes - 1}"
            if problem is None and rank in peers:
                problem = f"node rank {rank} already joined"
            if problem:
                log.warning("rendezvous: rejected %s: %s", peer_addr, problem)
                try:
                    conn.send({"op": "reject", "error": problem})
                except PeerLost:
                    pass
                conn.close()
                continue
            conn.send({"op": "welcome"})
            peers[rank] = conn
            log.info("rendezvous: node rank %d joined from %s (%d/%d)", rank, peer_addr[0], len(peers) + 1, nnodes)
    except BaseException:
        for c in peers.values():
            c.close()
        raise
    finally:
        lsock.close()
    return peers


def rendezvous_peer(addr: str, port: int, hello: dict[str, Any], timeout: float) -> LineConn:
    """A headless rank: connect to rank 0 (retrying) and join."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=2)
            break
        except OSError as e:
            if time.monotonic() >= deadline:
                raise CohortError(f"rendezvous: rank 0 at {addr}:{port} unreachable for {timeout:.0f} s ({e})") from e
            time.sleep(0.2)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = LineConn(sock)
    conn.send({"op": "hello", **hello})
    try:
        reply = conn.recv(timeout=30)
    except (TimeoutError, PeerLost) as e:
        conn.close()
        raise CohortError(f"rendezvous: no answer from rank 0 at {addr}:{port} ({e!r})") from e
    if reply.get("op") != "welcome":
        conn.close()
        raise CohortError(f"rendezvous: rank 0 at {addr}:{port} rejected node rank {hello['node_rank']}: "
                          f"{reply.get('error')}")
    log.info("rendezvous: joined rank 0 at %s:%d as node rank %d", addr, port, hello["node_rank"])
    return conn


class Collective:
    """The heartbeat collective of one rank (rank 0 drives it, the others echo)."""

    def __init__(  # noqa: PLR0913 (over the size limits of pyproject.toml; split it when it changes next)
        self,
        engine_id: str,
        rank: int,
        heartbeat_file: str,
        interval: float,
        on_peer_death: str,
        collective_timeout: float,
        peers: dict[int, LineConn] | None = None,
        leader: LineConn | None = None,
        on_stall: Callable[[str], None] = lambda why: None,
        on_resume: Callable[[], None] = lambda: None,
        on_fatal: Callable[[str], None] = lambda why: None,
        on_shutdown: Callable[[], None] = lambda: None,
        watchdog: NcclWatchdog | None = None,
    ) -> None:
        self.engine_id, self.rank = engine_id, rank
        self.heartbeat_file = heartbeat_file
        self.interval = interval
        self.mode = on_peer_death
        self.timeout = collective_timeout
        self.peers = peers or {}
        self.leader = leader
        self.on_stall, self.on_resume, self.on_fatal = on_stall, on_resume, on_fatal
        self.on_shutdown = on_shutdown
        self.watchdog = watchdog  # torch's NCCL watchdog, emulated (None: a collective may wait forever)
        self._watchdog_fired = False
        # a step not echoed within this long stalls the collective and freezes generation. On a real engine every
        # decode step is a collective, so generation stops within one step (tens of milliseconds) of a rank
        # stopping; the stand-in stops within interval + stall_after (0.05 + 0.2 s by default): never sooner than
        # a real engine. Not below 0.2 s: the testbed runs every host's ranks on a machine's few cores, and a rank
        # scheduled late there would freeze generation where a real cluster's would not (0.1 s failed the serving
        # cohort under an upgrade's load in CI).
        self.stall_after = max(0.2, 4 * interval)
        self.steps = 0
        self.last_step_at: float | None = None
        self.stalled = False
        self.halted = threading.Event()  # the hang-collective fault
        self.closing = False  # rank 0 is shutting down cleanly: losing peers is expected
        self._cond = threading.Condition()
        self._kick = threading.Event()  # run the next step now instead of after the interval

    def start(self) -> None:
        target = self._run_peer if self.leader is not None else self._run_leader
        threading.Thread(target=target, name="collective", daemon=True).start()

    def halt(self) -> None:
        """Fault hook: stop taking part, so every other rank stalls."""
        log.warning("fault: hang-collective: rank %d stops its heartbeat collective", self.rank)
        self.halted.set()

    def shutdown(self) -> None:
        """Rank 0's clean exit: tell the headless ranks to exit too (unlike a death, which they hang on)."""
        self.closing = True
        for p in self.peers.values():
            try:
                p.send({"op": "shutdown"})
            except PeerLost:
                pass

    def wait_for_progress(self, stop: threading.Event | None = None) -> bool:
        """Block until one more step completes (all ranks alive and answering)."""
        with self._cond:
            target = self.steps + 1
            self._kick.set()
            while self.steps < target:
                if stop is not None and stop.is_set():
                    return False
                self._cond.wait(0.1)
        return True

    def render_metrics(self, labels: dict[str, str]) -> str:
        return (
            render_family("shadowline_standin_collective_steps_total", "counter",
                          "Heartbeat collective steps completed by every rank of this engine.",
                          [(labels, float(self.steps))])
            + render_family("shadowline_standin_collective_last_step_timestamp_seconds", "gauge",
                            "Unix time of the last completed heartbeat collective step.",
                            [(labels, self.last_step_at)] if self.last_step_at else [])
            + render_family("shadowline_standin_collective_stalled", "gauge",
                            "1 while the heartbeat collective waits on a rank that stopped answering.",
                            [(labels, 1.0 if self.stalled else 0.0)])
        )

    # -- internals ------------------------------------------------------------------------------ #

    def _advance(self, step: int) -> None:
        now = time.time()
        tmp = f"{self.heartbeat_file}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{step} {now:.3f}\n")
        os.replace(tmp, self.heartbeat_file)
        with self._cond:
            self.steps, self.last_step_at = step, now
            self._cond.notify_all()

    def _hang_forever(self) -> None:
        threading.Event().wait()

    def _stuck_in_collective(self, why: str) -> None:
        """A rank that will never finish its collective: it waits as NCCL does, until the emulated watchdog's
        timeout ends the process (as torch's does), or forever without one."""
        if self.watchdog is not None and self.watchdog.teardown:
            if not self.stop_waiting(self.watchdog.timeout_s):
                self._watchdog_timeout(self.watchdog.timeout_s, why)
        self._hang_forever()

    def stop_waiting(self, seconds: float) -> bool:
        """Sleep ``seconds``; True if the rank is closing meanwhile (a clean shutdown needs no watchdog)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.closing:
                return True
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        return self.closing

    def _watchdog_timeout(self, waited: float, who: str) -> None:
        """torch's watchdog after a collective outlived the process group's timeout: it logs, sleeps 4 dump waits
        for the flight recorder, then tears the process down."""
        if self._watchdog_fired or self.watchdog is None:
            return
        self._watchdog_fired = True
        log.error("[PG ID 0 PG GUID 0 Rank %d] Watchdog caught collective operation timeout: the heartbeat "
                  "collective waited %.1f s on %s (timeout %.0f s); ending the process in %.1f s "
                  "(TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC x 4)", self.rank, waited, who, self.watchdog.timeout_s,
                  4 * self.watchdog.dump_wait_s)
        time.sleep(4 * self.watchdog.dump_wait_s)
        self.on_fatal(f"NCCL watchdog: collective timed out after {waited:.1f} s waiting on {who}")

    def _stall(self, why: str) -> None:
        if not self.stalled:
            self.stalled = True
            log.warning("collective stalled: %s", why)
            self.on_stall(why)

    def _lost(self, who: str, error: object) -> None:
        if self.closing:
            self._hang_forever()
        why = f"{who} lost ({error})"
        if self.mode == "exit":
            log.error("collective: %s; SHADOWLINE_STANDIN_ON_PEER_DEATH=exit", why)
            self.on_fatal(why)
        self._stall(f"{why}; hanging as NCCL would (SHADOWLINE_STANDIN_ON_PEER_DEATH=hang)")
        self._stuck_in_collective(why)

    def _check_timeout(self, waited: float, who: str) -> None:
        if self.mode == "exit" and self.timeout > 0 and waited >= self.timeout:
            why = f"{who} has not answered for {waited:.1f} s (SHADOWLINE_STANDIN_COLLECTIVE_TIMEOUT)"
            log.error("collective: %s", why)
            self.on_fatal(why)
        if self.watchdog is not None and self.watchdog.teardown and waited >= self.watchdog.timeout_s:
            self._watchdog_timeout(waited, who)

    def _run_leader(self) -> None:
        step = 0
        while True:
            if self.halted.is_set():
                self._stall("this rank stopped its collective (hang-collective fault)")
                self._stuck_in_collective("this rank's own stuck collective (hang-collective fault)")
            step += 1
            for r, p in self.peers.items():
                try:
                    p.send({"op": "step", "n": step})
                except PeerLost as e:
                    self._lost(f"node rank {r}", e)
            for r, p in self.peers.items():
                waited = 0.0
                while True:
                    try:
                        p.recv(timeout=self.stall_after)
                        break
                    except TimeoutError:
                        waited += self.stall_after
                        self._stall(f"node rank {r} has not answered step {step} for {waited:.1f} s")
                        self._check_timeout(waited, f"node rank {r}")
                    except (PeerLost, ValueError) as e:
                        self._lost(f"node rank {r}", e)
            if self.stalled:
                self.stalled = False
                log.warning("collective resumed at step %d", step)
                self.on_resume()
            self._advance(step)
            self._kick.wait(self.interval)
            self._kick.clear()

    def _run_peer(self) -> None:
        if not (self.leader is not None):
            raise AssertionError("unreachable: checked above")
        waited = 0.0
        while True:
            try:
                msg = self.leader.recv(timeout=self.stall_after)
            except TimeoutError:
                waited += self.stall_after
                if waited == self.stall_after:
                    log.warning("collective: no step from node rank 0 for %.1f s; waiting", waited)
                self._check_timeout(waited, "node rank 0")
                continue
            except (PeerLost, ValueError) as e:
                self._lost("node rank 0", e)
                return
            waited = 0.0
            if msg.get("op") == "shutdown":
                log.info("collective: node rank 0 is shutting down cleanly; this rank exits too")
                self.on_shutdown()
                return
            if self.halted.is_set():
                self._stall("this rank stopped its collective (hang-collective fault)")
                self._stuck_in_collective("this rank's own stuck collective (hang-collective fault)")
            self._advance(int(msg["n"]))
            try:
                self.leader.send({"op": "step", "n": msg["n"]})
            except PeerLost as e:
                self._lost("node rank 0", e)
                return
