"""Run one engine rank as a child and turn a hang into an exit:
``python -m shadowline.slurm.watchdog [options] -- ARGV``.

A dead rank ends its Slurm step by itself (``srun --kill-on-bad-exit=1``); a hung one would not: vLLM's
``/health`` can stay 200 while a rank is stuck, and headless ranks wait forever in a collective. The watchdog
watches what a hang stops:

- a leader rank (no ``--headless``) with ``DYN_SYSTEM_PORT`` set: its ``/health`` on
  ``DYN_SYSTEM_HOST:DYN_SYSTEM_PORT``. Armed once it first answered 200; a hang is no 200 for
  ``--health-timeout`` seconds (no answer at all, as from a frozen process, counts);
- the same leader's generation progress: vLLM's ``vllm:num_requests_running`` and
  ``vllm:generation_tokens_total`` on its ``/metrics`` (common/progress.py): a stall is requests running and
  the token counter still for ``--progress-stall`` seconds, wherever the stuck rank runs (a rank stuck in a
  collective stops every step of the leader). Headless ranks expose nothing of their own: they are ended by
  torch's NCCL watchdog (the plan's environment) or their step's teardown.

Whether a rank is hung is policy.HangPolicy's judgement, the one the node agent and the status table use.

On a hang it kills the child's whole process group with SIGKILL, revokes the leader's discovery registration
(found by the ports the group listened on; the frontend stops routing to it within milliseconds, see
discovery.py; with the rank's own etcd identity, ETCD_AUTH_USERNAME/PASSWORD, at ``--etcd-endpoints`` over TLS
with ``--etcd-ca/--etcd-cert/--etcd-key`` where given: a job's etcd over TLS, whose Dynamo endpoint is the node's
gRPC-only etcd proxy) and exits 124, so Slurm tears down the rest of the step. Otherwise it exits with the child's
status (128+N for a signal).

SIGTERM and SIGINT are forwarded to the child. SIGTERM is what Slurm sends every process of a step it tears
down (a rank died: ``--kill-on-bad-exit``; ``scancel``), so a rank still running ``--term-grace`` seconds later
is killed with its group; with ``--term-grace 0`` (the default of ``gms_failover.term_grace_s``) at once, so the
failover lock is free milliseconds after the failure rather than after the engine's graceful shutdown. SIGINT
is the orderly stop, with ``--stop-grace``. A child that is frozen (stopped) when asked to stop is killed at
once (it cannot act on the signal, and would hold the failover lock until Slurm's KillWait runs out).

Every decision is logged on stderr, and each event also as one line ``SHADOWLINE_EVENT {json}`` (time, node,
cohort, rank, event, detail) that the Slurm supervisor copies into the job's event log.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

from ..backends import BACKENDS
from ..cluster import discovery
from ..cluster.access import client_context, etcd_from_env
from ..common import console, progress
from ..common.etcd_client import Etcd, EtcdError
from ..common.http import http_get
from ..common.policy import HangPolicy
from ..common.proc import group_members, listening_ports, stopped

HANG_EXIT = 124
KEEP_WARM_S = 60.0  # how often the revoking client touches etcd (a fifth of etcd's --auth-token-ttl default)
WARM_KEY = "v1/instances/"  # a read a Dynamo identity may do (its roles' prefix, v1/)
EVENT_PREFIX = "SHADOWLINE_EVENT "


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z"
    console.err(f"{stamp} shadowline.slurm.watchdog[{os.getpid()}]: {message}")


def emit(event: str, **detail: object) -> None:
    """One machine-readable event line (the supervisor parses these from the step's output)."""
    record = {"time": round(time.time(), 3), "node": socket.gethostname(),
              "cohort": _int_env("SHADOWLINE_COHORT"), "rank": _int_env("SHADOWLINE_NODE_RANK"),
              "step": _step_id(), "event": event, "detail": detail}
    console.err(EVENT_PREFIX + json.dumps(record, sort_keys=True))


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def _step_id() -> str | None:
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    return f"{job}.{step}" if job and step else None


# -- what to watch ----------------------------------------------------------------------------------------- #

def _flag(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


@dataclass
class Target:
    leader: bool
    node_rank: int
    engine_id: str
    health_url: str | None
    metrics_url: str | None
    address: str | None  # the leader's address, to find its registration
    system_port: int | None
    model: str | None  # the served model name

    @classmethod
    def of(cls, argv: list[str]) -> Target:
        leader = "--headless" not in argv
        engine = next((b for b in BACKENDS.values() if b.runs(argv)), None)
        node_rank = int(_flag(argv, "--node-rank") or 0)
        engine_id = os.environ.get("ENGINE_ID", "0")
        host = os.environ.get("DYN_SYSTEM_HOST", "").strip() or "127.0.0.1"
        port = os.environ.get("DYN_SYSTEM_PORT", "").strip()
        health = f"http://{host}:{port}/health" if leader and port.isdigit() else None
        path = engine.progress_metrics_path if engine else None
        metrics = f"http://{host}:{port}{path}" if leader and port.isdigit() and path else None
        address = host if leader else _flag(argv, "--master-addr")
        return cls(leader, node_rank, engine_id, health, metrics, address,
                   int(port) if port.isdigit() else None, _flag(argv, "--served-model-name"))


class HealthProbe:
    """No 200 from /health for the policy's health timeout, after a first 200."""

    def __init__(self, url: str, policy: HangPolicy) -> None:
        self.url, self.policy = url, policy
        self.last_ok: float | None = None

    def check(self, now: float) -> str | None:
        answer = http_get(self.url, min(0.5, self.policy.health_timeout_s / 2))
        if answer is not None and answer[0] == 200:
            if self.last_ok is None:
                log(f"{self.url} passed: watching it (hang = no 200 for {self.policy.health_timeout_s:g} s)")
            self.last_ok = now
            return None
        silent = now - self.last_ok if self.last_ok is not None else None
        if self.policy.judge(None, silent):
            return f"{self.url} gave no 200 for {silent:.1f} s"
        return None


class ProgressProbe:
    """Requests running and vLLM's generated-token counter still for the policy's stall time (progress.judge)."""

    def __init__(self, url: str, policy: HangPolicy) -> None:
        self.url, self.policy = url, policy
        self.observation: progress.Observation | None = None
        self.read_at = float("-inf")

    def check(self, now: float) -> str | None:
        if now - self.read_at < self.policy.progress_every_s:
            return None
        self.read_at = now
        answer = http_get(self.url, 0.5)
        sample = progress.parse_sample(answer[1]) if answer is not None and answer[0] == 200 else None
        if sample is None:
            return None  # no answer (HealthProbe judges that), or no progress metrics (yet)
        if self.observation is None:
            log(f"{self.url} has vLLM's progress metrics: watching them "
                f"(stall = requests running, no token for {self.policy.progress_stall_s:g} s)")
        verdict = progress.judge(self.observation, sample, now, self.policy)
        self.observation = verdict.observation
        return progress.describe(verdict, self.policy) if verdict.stalled else None


# -- the child ------------------------------------------------------------------------------------------ #

def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


@dataclass(frozen=True)
class EtcdSettings:
    """Where the watchdog reaches etcd to revoke a registration: ``endpoints`` (the job's members; None: the
    rank's ETCD_ENDPOINTS) over TLS with the CA and client certificate given (none: plain)."""
    endpoints: str | None = None
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def client(self) -> Etcd | None:
        """The rank's etcd as its own identity (ETCD_AUTH_USERNAME/PASSWORD), None without endpoints."""
        context = client_context(self.ca, self.cert, self.key) if self.ca else None
        return etcd_from_env(timeout=1.0, endpoints=self.endpoints, context=context)


class Revoker:
    """The watchdog's etcd client for revoking a registration, made and authenticated when the watchdog starts
    and used every KEEP_WARM_S (``keep_warm``, a thread) so that its token and connection are ready when a
    revocation is due: a new client's first call costs a TLS handshake and a bcrypt-checked authentication
    (68-70 ms on the testbed), during which the frontend still routes to the killed rank; etcd forgets a token
    unused for ``--auth-token-ttl`` (300 s)."""

    def __init__(self, settings: EtcdSettings) -> None:
        self.settings = settings
        self._etcd: Etcd | None = None
        self._lock = threading.Lock()  # never taken in a signal handler: the loop revokes, not the handler

    def client(self) -> Etcd | None:
        with self._lock:
            if self._etcd is None:
                self._etcd = self.settings.client()
            return self._etcd

    def keep_warm(self, stop: threading.Event) -> None:
        while True:
            try:
                etcd = self.client()
                if etcd is None:
                    return
                etcd.get(WARM_KEY)
            except (EtcdError, OSError, ValueError):
                pass  # a revocation says what is wrong, if one is due
            if stop.wait(KEEP_WARM_S):
                return


def revoke_registration(target: Target, ports: set[int], revoker: Revoker) -> list[int]:
    """Revoke the rank's discovery registration: the leases of its worker, matched by the ports its process
    group listened on (taken before the kill) or by its system port."""
    if not target.address:
        return []
    try:
        etcd = revoker.client()
        if etcd is None:
            return []
        found = discovery.worker_registrations(etcd, target.address, target.system_port, ports, target.model)
        return discovery.revoke_leases(etcd, [r.lease for r in found])
    except (EtcdError, OSError, ValueError) as err:  # OSError, ssl.SSLError: the certificate's files
        log(f"could not revoke the registration: {err}")
        return []


@dataclass(frozen=True)
class Killed:
    """A teardown whose kill is done: what is left is the registration's revocation and the event."""
    event: str
    reason: str
    started: float
    ports: frozenset[int]


def kill_at_once(target: Target, child: subprocess.Popen, event: str, reason: str, revoke: bool) -> Killed:
    """Kill the rank's process group at once (the ports it listened on taken first, to find its registration).
    Safe in a signal handler: no wait on the child (Popen's wait lock may be held by the code it interrupted) and
    nothing written (the code it interrupted may be inside a write to stderr, whose buffer's lock a second write
    from the handler cannot take: Python raises "reentrant call" there, which would end the watchdog with the rank
    left running); finish_teardown logs it."""
    started = time.time()
    ports = listening_ports(group_members(child.pid)) if revoke and target.leader else set()
    kill_group(child.pid)
    return Killed(event, reason, started, frozenset(ports))


def finish_teardown(target: Target, child: subprocess.Popen, killed: Killed, revoke: Revoker | None) -> None:
    """Revoke the killed rank's registration (unless ``revoke`` is None), reap it, log and emit the event."""
    log(f"{killed.event}: {killed.reason}; killed process group {child.pid}"
        + (", revoking its discovery registration" if revoke else ""))
    revoked = revoke_registration(target, set(killed.ports), revoke) if revoke else []
    child.wait()
    emit(killed.event, reason=killed.reason, detected=round(killed.started, 3),
         revoked=[f"{lease:x}" for lease in revoked], teardown_s=round(time.time() - killed.started, 3))


def teardown(target: Target, child: subprocess.Popen, event: str, reason: str, revoke: Revoker | None) -> None:
    """Kill the rank's process group at once and revoke its registration (unless ``revoke`` is None); log and
    emit ``event``."""
    finish_teardown(target, child, kill_at_once(target, child, event, reason, revoke is not None), revoke)


# -- main loop ------------------------------------------------------------------------------------------ #

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m shadowline.slurm.watchdog",
                                description="Run an engine rank; exit non-zero when its health or generation stalls.")
    p.add_argument("--health-timeout", type=float, default=3.0, help="seconds without a 200 from /health (leader)")
    p.add_argument("--progress-stall", type=float, default=60.0,
                   help="seconds with requests running and no generated token (leader; gms_failover.progress_stall_s)")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between checks")
    p.add_argument("--term-grace", type=float, default=10.0,
                   help="SIGTERM (a step torn down): seconds the rank may take to exit before its group is killed; "
                        "0 kills it at once, so the failover lock is free immediately (gms_failover.term_grace_s)")
    p.add_argument("--stop-grace", type=float, default=30.0,
                   help="SIGINT (an orderly stop): seconds the rank may take to exit before its group is killed")
    p.add_argument("--no-revoke", action="store_true", help="do not revoke the discovery registration on a hang")
    p.add_argument("--etcd-endpoints", help="etcd's members, to revoke the registration (default: ETCD_ENDPOINTS)")
    p.add_argument("--etcd-ca", help="etcd's CA certificate (its clients over TLS)")
    p.add_argument("--etcd-cert", help="this node's etcd client certificate")
    p.add_argument("--etcd-key", help="its key")
    return parse_with_command(p, argv, "rank")


def parse_with_command(p: argparse.ArgumentParser, argv: list[str] | None, what: str) -> argparse.Namespace:
    """``p``'s options, then ``-- ARGV``: the command of the child (the watchdog's rank, the keeper's server)."""
    p.add_argument("command", nargs=argparse.REMAINDER, help=f"-- ARGV of the {what}")
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error(f"give the {what}'s command after --")
    return args


def revoker_of(args: argparse.Namespace, target: Target) -> Revoker | None:
    """How the cohort's registration is revoked (None: ``--no-revoke``), kept warm where there is one to find."""
    if args.no_revoke:
        return None
    revoker = Revoker(EtcdSettings(args.etcd_endpoints, args.etcd_ca, args.etcd_cert, args.etcd_key))
    if target.address:
        threading.Thread(target=revoker.keep_warm, args=(threading.Event(),), name="etcd-warm", daemon=True).start()
    return revoker


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target = Target.of(args.command)
    policy = HangPolicy(health_timeout_s=args.health_timeout, progress_stall_s=args.progress_stall)
    revoke = revoker_of(args, target)
    probes: list[HealthProbe | ProgressProbe] = []
    if target.health_url:
        probes.append(HealthProbe(target.health_url, policy))
    if target.metrics_url:
        probes.append(ProgressProbe(target.metrics_url, policy))

    forwarded: list[int] = []
    early: list[int] = []  # signals that came before the child existed
    killed_on_term: list[Killed] = []  # killed by the handler; revoked and reported by the loop
    child: subprocess.Popen | None = None

    def forward(signum: int, _frame: object) -> None:
        if child is None:
            early.append(signum)
            return
        if signum == signal.SIGTERM and args.term_grace <= 0 and not killed_on_term and child.returncode is None:
            killed_on_term.append(kill_at_once(target, child, "killed-on-term", "SIGTERM: the step is being torn "
                                               "down", revoke is not None))
            return
        forwarded.append(signum)
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)  # before the child starts: no signal may find us without a handler
    signal.signal(signal.SIGINT, forward)
    child = subprocess.Popen(args.command, process_group=0)
    for signum in early:
        forward(signum, None)
    kind = "leader" if target.leader else "headless"
    log(f"running {kind} rank {target.node_rank} of engine {target.engine_id} as pid {child.pid}: "
        f"{' '.join(args.command[:4])} ...; probes: {[type(p).__name__ for p in probes] or 'none'}")
    emit("rank-started", pid=child.pid, leader=target.leader, probes=[type(p).__name__ for p in probes])

    forwarded_at = 0.0
    while True:
        code = child.poll()
        if code is not None:
            if killed_on_term:
                finish_teardown(target, child, killed_on_term[0], revoke)
            kill_group(child.pid)  # whatever the rank left behind in its group
            status = exit_status(code)
            log(f"rank exited with status {status}")
            emit("rank-exited", status=status, forwarded=[signal.Signals(s).name for s in forwarded])
            return status
        now = time.monotonic()
        if forwarded:
            # Stopping: a frozen rank cannot act on the signal, and one that outlives its grace is hung too.
            forwarded_at = forwarded_at or now
            grace = args.term_grace if signal.SIGTERM in forwarded else args.stop_grace
            if child.poll() is None and (stopped(child.pid) or now - forwarded_at > grace):
                why = "frozen" if stopped(child.pid) else f"still running {grace:g} s after it"
                teardown(target, child, "hang-detected",
                         f"asked to stop ({signal.Signals(forwarded[0]).name}) but {why}", revoke)
                return HANG_EXIT
        else:
            problem = next((p for p in (probe.check(time.monotonic()) for probe in probes) if p), None)
            if problem and child.poll() is None:  # (a SIGTERM during the check may have ended it already)
                teardown(target, child, "hang-detected", problem, revoke)
                return HANG_EXIT
        try:
            child.wait(timeout=args.interval)  # returns at once when the rank exits
        except subprocess.TimeoutExpired:
            pass


if __name__ == "__main__":
    raise SystemExit(main())
