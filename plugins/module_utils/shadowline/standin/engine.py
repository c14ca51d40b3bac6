"""Stand-in engine rank: ``python -m shadowline.standin.engine`` in place of ``python -m dynamo.vllm``.

Same argv and environment as the real engine (Dynamo 1.6.1's ``dynamo.vllm``); on CPU. One
process per node of a cohort: node-rank 0 is the leader (it runs the Dynamo worker and walks the
shadow lifecycle), ranks started with ``--headless`` hold their weight shard and take part in the
heartbeat collective only. Read top to bottom, the leader:

1. checks its input like dynamo.vllm does and refuses what it would refuse;
2. creates the failover metrics (state ``init``; restores persisted switch counters) and its
   system server (/health 503 until standby, /metrics);
3. gets its weights: ``ENGINE_ID=0`` reads the safetensors of ``--model`` and publishes each local
   GPU's shard into GMS (or imports it if GMS already holds that model, upstream's RW_OR_RO);
   other engine ids import from GMS and read no byte of the model from disk;
4. rendezvous with its headless ranks and starts the heartbeat collective;
5. in shadow mode: pauses (state ``standby``, /health 200, the ``[Shadow] Engine paused...`` line),
   polls the flock every 0.1 s, writes ``engine-<id>`` when it wins, wakes (state ``waking``,
   counting a switch attempt if the lock was contended);
6. waits for one collective step (a hung rank keeps it here, lock held), starts ``dynamo.mocker``,
   waits until it is registered, logs ``[Shadow] Engine awake, registering with discovery`` and
   enters ``active`` (counting a switch success after a contended lock);
7. serves until SIGTERM (stops the worker, releases the lock, exit 0) or until its worker dies
   (exit 1: the engine dies as a unit).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..common import lock as failover_lock
from . import cohort, faults, gms_client, logs, settings, system_server, weights
from .failover_metrics import FailoverMetrics
from .progress_metrics import ProgressMetrics
from .worker import Worker, http_get

log = logging.getLogger("shadowline.standin.engine")


class Shutdown(Exception):
    """SIGTERM/SIGINT arrived while the engine was still booting."""


# -- input ---------------------------------------------------------------------------------------- #

def model_len(text: str) -> int:
    """vLLM's ``--max-model-len``: a number of tokens, with an optional k or m (``32k``); anything else is refused
    at start, as vLLM's argument parser refuses it (the stand-in models no context length beyond that)."""
    scale = {"k": 1000, "m": 1000 ** 2}.get(text[-1:].lower(), 1)
    digits = text[:-1] if scale != 1 else text
    if not digits.isdigit() or int(digits) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of tokens (e.g. 32768 or 32k)")
    return int(digits) * scale


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m shadowline.standin.engine", allow_abbrev=False,
                                description="CPU stand-in for python -m dynamo.vllm (shadow failover).")
    p.add_argument("--model", required=True)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--endpoint", default=None, help="dyn://namespace.component.endpoint (Dynamo's flag)")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--enable-sleep-mode", action="store_true")
    p.add_argument("--gms-shadow-mode", action="store_true", default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--distributed-executor-backend", default=None)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--max-model-len", type=model_len, default=None)
    p.add_argument("--distributed-timeout-seconds", type=int, default=None,
                   help="vLLM's process-group timeout; the emulated NCCL watchdog ends a stuck rank after it")
    return p.parse_known_args(argv)


@dataclass
class Config:
    model: str
    name: str  # served model name
    component: str
    endpoint: str | None
    gms: bool
    shadow: bool
    tp: int
    nnodes: int
    rank: int
    headless: bool
    master_addr: str
    master_port: int
    engine_id: str
    host: str
    system_port: int | None
    pg_timeout_s: int | None = None  # --distributed-timeout-seconds (None: torch's NCCL default, 600 s)
    gpus: list[tuple[str, int]] = field(default_factory=list)  # (GPU UUID, TP rank) on this node


def configure(args: argparse.Namespace) -> Config:
    """The engine's configuration, or SystemExit(2) with the reason, as dynamo.vllm would refuse it."""

    def refuse(msg: str) -> None:
        raise SystemExit(f"error: {msg}")

    shadow = bool(args.gms_shadow_mode) or settings.env_bool("DYN_VLLM_GMS_SHADOW_MODE")
    gms = args.load_format == "gms"
    if shadow and not gms:
        refuse("--gms-shadow-mode requires --load-format gms. Shadow mode depends on GMS for VA-stable weight sharing.")
    if gms and settings.env_bool("DYN_GMS_USE_V1"):
        refuse("DYN_GMS_USE_V1=true cannot be combined with --load-format gms")
    if args.tensor_parallel_size < 1 or args.nnodes < 1:
        refuse("--tensor-parallel-size and --nnodes must be at least 1")
    if args.tensor_parallel_size % args.nnodes:
        refuse(f"--tensor-parallel-size {args.tensor_parallel_size} is not divisible by --nnodes {args.nnodes}")
    if not 0 <= args.node_rank < args.nnodes:
        refuse(f"--node-rank {args.node_rank} is not in 0..{args.nnodes - 1}")
    if args.nnodes > 1 and args.distributed_executor_backend != "mp":
        refuse("multi-node (--nnodes > 1) needs --distributed-executor-backend mp")
    if args.headless != (args.node_rank > 0):
        refuse("--headless goes with every --node-rank other than 0, and only with those")
    if not os.path.isdir(args.model):
        refuse(f"--model {args.model} is not a directory (the stand-in needs a local model dir)")
    engine_id = os.environ.get("ENGINE_ID", "0")
    if not engine_id.isdigit():
        refuse(f"ENGINE_ID={engine_id!r} is not a non-negative integer")
    port_raw = os.environ.get("DYN_SYSTEM_PORT", "").strip()
    if port_raw and not (port_raw.isdigit() and 0 < int(port_raw) < 65536):
        refuse(f"DYN_SYSTEM_PORT={port_raw!r} is not a port")

    if os.environ.get("DYN_SYSTEM_HOST", "").strip() in ("", "0.0.0.0", "::"):
        log.warning("DYN_SYSTEM_HOST is %r: the stand-in listens on 127.0.0.1 instead (it never binds all addresses)",
                    os.environ.get("DYN_SYSTEM_HOST", ""))
    local = args.tensor_parallel_size // args.nnodes
    uuids = settings.standin_gpus()
    if gms and len(uuids) < local:
        refuse(f"--load-format gms with {local} GPU(s) per node needs SHADOWLINE_STANDIN_GPUS to list at least "
               f"{local} fake GPU UUID(s), it lists {len(uuids)}")
    uuids = uuids[:local] if len(uuids) >= local else [f"cpu{i}" for i in range(local)]
    endpoint = args.endpoint
    parts = (endpoint or "dyn://dynamo.backend.generate").split("://")[-1].split(".")
    return Config(
        model=os.path.abspath(args.model),
        name=(args.served_model_name or [args.model])[0],
        component=parts[1] if len(parts) == 3 else "backend",
        endpoint=endpoint,
        gms=gms,
        shadow=shadow,
        tp=args.tensor_parallel_size,
        nnodes=args.nnodes,
        rank=args.node_rank,
        headless=args.headless,
        master_addr=args.master_addr,
        master_port=args.master_port,
        engine_id=engine_id,
        host=settings.system_host(),
        system_port=int(port_raw) if port_raw else None,
        pg_timeout_s=args.distributed_timeout_seconds,
        gpus=[(u, args.node_rank * local + i) for i, u in enumerate(uuids)],
    )


# -- weights ---------------------------------------------------------------------------------------- #

def rchar() -> int:
    with open("/proc/self/io", encoding="ascii") as f:
        return int(f.readline().split()[1])


class Weights:
    """This rank's shards, mapped read-only; their GMS sessions are watched for a lost server."""

    def __init__(self, cfg: Config, stopping: threading.Event) -> None:
        self.cfg, self.stopping = cfg, stopping
        self.shards: list[weights.MappedShard] = []
        self.sessions: list[Any] = []

    def load(self) -> None:
        cfg = self.cfg
        before = rchar()
        started = time.monotonic()
        identity = {"model": cfg.name, "model_path": cfg.model, "engine_id": cfg.engine_id}
        delay = settings.load_delay()
        if delay:
            log.info("loading slowly: %.1f s more (SHADOWLINE_STANDIN_LOAD_DELAY)", delay)
            if self.stopping.wait(delay):
                raise Shutdown
        for gpu, tp_rank in cfg.gpus:
            if not cfg.gms:
                shard = weights.build_shard(cfg.model, cfg.tp, tp_rank, gpu, identity)
                self.shards.append(weights.map_shard(shard.fd, shard.header, verify=False))
                os.close(shard.fd)
                continue
            path = settings.gms_socket_path(gpu, "weights")
            expect = {"model": cfg.name, "model_path": cfg.model, "tp_size": cfg.tp, "tp_rank": tp_rank}
            timeout = settings.gms_timeout()
            if cfg.engine_id == "0":
                got = gms_client.import_layout(path, expect, timeout, wait=0.0)
                if got is None:
                    shard = weights.build_shard(cfg.model, cfg.tp, tp_rank, gpu, identity)
                    session, gen = gms_client.publish(path, shard, timeout)
                    self.shards.append(weights.map_shard(shard.fd, shard.header, verify=False))
                    os.close(shard.fd)
                    log.info("[GMS] %s: loaded TP rank %d/%d from disk (%d bytes) and published it (generation %d)",
                             gpu, tp_rank, cfg.tp, shard.size, gen)
                    self._watch(session, path)
                    continue
                log.info("[GMS] %s: GMS already holds this model's TP rank %d: importing read-only (RW_OR_RO)",
                         gpu, tp_rank)
            else:
                got = gms_client.import_layout(path, expect, timeout, wait=timeout)
                if got is None:
                    raise gms_client.GMSError(
                        f"no committed weights on {path} after {timeout:.0f} s: a writer (ENGINE_ID=0) must publish "
                        "into this GMS server first")
            header, fd, session = got
            try:
                self.shards.append(weights.map_shard(fd, header, verify=True))
            finally:
                os.close(fd)
            log.info("[GMS] %s: imported TP rank %d/%d read-only from GMS (%d bytes, generation %d, %s)",
                     gpu, tp_rank, cfg.tp, header["size"], header["generation"], header["digest"])
            self._watch(session, path)
        total = sum(int(s.header["size"]) for s in self.shards)
        log.info("weights ready: %d shard(s), %d bytes mapped, in %.3f s; this process read %d bytes while loading",
                 len(self.shards), total, time.monotonic() - started, rchar() - before)

    def _watch(self, session: Any, path: str) -> None:
        self.sessions.append(session)

        def lost(p: str) -> None:
            if not self.stopping.is_set():
                log.warning("[GMS] connection to the GMS server lost (%s): the weights already mapped stay valid and "
                            "this engine keeps serving, but no engine can import weights until the GMS server is "
                            "restarted and a writer (ENGINE_ID=0) republishes", p)

        gms_client.watch(session, path, lost)


# -- ranks ------------------------------------------------------------------------------------------ #

class Rank:
    """What leader and headless ranks share: signals, faults, weights, collective, heartbeat file."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.stopping = threading.Event()
        self.booting = True
        self.hang_on_wake = False  # the hang-wake fault: stuck once it holds the lock, before it is active
        self.stop_signal = 0  # the SIGTERM or SIGINT that asked us to stop (logged by shutdown)
        self.worker: Worker | None = None
        self.collective: cohort.Collective | None = None
        self.state_dir = settings.state_dir()
        os.makedirs(self.state_dir, exist_ok=True)
        self.heartbeat_file = settings.heartbeat_path(cfg.engine_id, cfg.rank, self.state_dir)
        self.weights = Weights(cfg, self.stopping)

    def say_why_stopping(self) -> None:
        """The log line for the signal that stopped us (once; the handler itself writes nothing)."""
        if self.stop_signal:
            log.info("%s: shutting down", signal.Signals(self.stop_signal).name)
            self.stop_signal = 0

    def install_handlers(self) -> None:
        def on_term(signum: int, _frame: Any) -> None:  # writes nothing: it may interrupt a write (watchdog.py)
            self.stop_signal = self.stop_signal or signum
            self.stopping.set()
            if self.booting:
                raise Shutdown

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        faults.install(settings.fault_paths(self.cfg.engine_id, self.cfg.rank, self.state_dir), self.fault)

    def fault(self, fault: str, origin: str) -> None:
        if fault == "crash":
            log.error("fault: crash (%s): exiting at once", origin)
            if self.worker is not None:
                self.worker.signal(signal.SIGKILL)
            logging.shutdown()
            os._exit(134)
        elif fault == "hang":
            log.warning("fault: hang (%s): freezing the worker and this rank with SIGSTOP (lock kept; SIGCONT "
                        "resumes)", origin)
            if self.worker is not None:
                self.worker.signal(signal.SIGSTOP)
            os.kill(os.getpid(), signal.SIGSTOP)
            log.warning("fault: hang: resumed by SIGCONT")
            if self.worker is not None and not self.worker.frozen:
                self.worker.signal(signal.SIGCONT)
        elif fault == "hang-collective":
            if self.collective is not None:
                self.collective.halt()
        elif fault == "hang-wake":
            log.warning("fault: hang-wake (%s): this rank will hang once it takes the failover lock", origin)
            self.hang_on_wake = True

    def die(self, why: str) -> None:
        """Exit non-zero at once (ON_PEER_DEATH=exit); the worker goes with us."""
        log.error("exiting: %s", why)
        if self.worker is not None:
            self.worker.signal(signal.SIGKILL)
        logging.shutdown()
        os._exit(1)

    def start_collective(self, peers: dict[int, cohort.LineConn] | None, leader: cohort.LineConn | None) -> None:
        self.collective = cohort.Collective(
            self.cfg.engine_id, self.cfg.rank, self.heartbeat_file, settings.heartbeat_interval(),
            settings.on_peer_death(), settings.collective_timeout(), peers=peers, leader=leader,
            on_stall=lambda why: self.worker.freeze(f"the collective stalled: {why}") if self.worker else None,
            on_resume=lambda: self.worker.thaw() if self.worker else None,
            on_fatal=self.die,
            on_shutdown=self.stopping.set,
            watchdog=settings.nccl_watchdog(self.cfg.pg_timeout_s),
        )
        self.collective.start()

    def hello(self) -> dict[str, Any]:
        return {"engine_id": self.cfg.engine_id, "nnodes": self.cfg.nnodes, "tp_size": self.cfg.tp,
                "node_rank": self.cfg.rank, "model": self.cfg.name}

    def cleanup(self) -> None:
        for s in self.weights.sessions:
            s.close()
        try:
            os.unlink(self.heartbeat_file)
        except FileNotFoundError:
            pass


class Headless(Rank):
    def run(self) -> int:
        cfg = self.cfg
        self.install_handlers()
        try:
            self.weights.load()
            leader = cohort.rendezvous_peer(cfg.master_addr, cfg.master_port, self.hello(),
                                            settings.rendezvous_timeout())
            self.start_collective(None, leader)
            self.booting = False
            log.info("headless rank %d of engine %s running (heartbeat %s)", cfg.rank, cfg.engine_id,
                     self.heartbeat_file)
            while not self.stopping.is_set():
                self.stopping.wait(0.5)
        except Shutdown:
            pass
        except (gms_client.GMSError, weights.WeightsError, cohort.CohortError, OSError) as e:
            log.error("engine failed: %s", e)
            return 1
        finally:
            self.say_why_stopping()
            self.stopping.set()
            self.cleanup()
        return 0


class Leader(Rank):
    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.metrics: FailoverMetrics | None = None
        self.lock: failover_lock.FailoverLock | None = None
        self.healthy = False
        self.serving = False
        self.started = time.time()
        self.labels = {"engine_id": cfg.engine_id, "model": cfg.name, "dynamo_component": cfg.component}
        self.progress = ProgressMetrics(cfg.name)  # vLLM's progress metrics, from the worker's (progress_metrics.py)

    # system server callbacks
    def health(self) -> tuple[int, dict]:
        state = self.metrics.state if self.metrics else None
        up = time.time() - self.started
        doc = {"status": "ready" if self.healthy else "notready",
               "uptime": {"secs": int(up), "nanos": int((up % 1) * 1e9)},
               "endpoints": {"generate": "ready" if self.serving else "notready"},
               "engine_id": self.cfg.engine_id, "failover_state": state}
        return (200 if self.healthy else 503), doc

    def render_metrics(self) -> str:
        text = self.metrics.render() if self.metrics else ""
        if self.collective is not None:
            text += self.collective.render_metrics(self.labels)
        worker_text = self.worker_metrics()
        if worker_text is not None:
            self.progress.observe_worker(worker_text)
        text += self.progress.render()
        if self.serving and self.worker is not None and self.worker.frozen:  # as Dynamo's live runtime would count
            text += self.progress.render_handler_while_frozen(self.worker.requests_waiting())
        return text + (worker_text or "")

    def worker_metrics(self) -> str | None:
        """The worker's own /metrics while it serves and is not frozen (None otherwise)."""
        if not self.serving or self.worker is None or self.worker.frozen or self.worker.proc.poll() is not None:
            return None
        try:
            status, _unused, body = http_get(self.worker.base_url + "/metrics", 0.5)
        except OSError:
            return None
        return body.decode(errors="replace") if status == 200 else None

    def proxy(self, path: str) -> tuple[int, dict[str, str], bytes] | None:
        if not self.serving or self.worker.frozen or self.worker.proc.poll() is not None:
            return None
        try:
            return http_get(self.worker.base_url + path, 5.0)
        except OSError:
            return None

    def run(self) -> int:
        self.install_handlers()
        try:
            return self._run()
        except Shutdown:
            return self.shutdown(0)
        except (gms_client.GMSError, weights.WeightsError, cohort.CohortError, OSError) as e:
            log.error("engine failed: %s", e)
            return self.shutdown(1)

    def park_until_the_lock(self) -> bool:
        """Shadow mode: standby until the failover lock is ours, then waking; False when stopped meanwhile."""
        if self.metrics is None or self.worker is None:
            raise RuntimeError("park_until_the_lock before the engine started")
        self.metrics.set_state("standby")
        self.healthy = True
        log.info("[Shadow] Engine paused, startup probe now passing, waiting for lock")
        self.booting = False
        if settings.env_bool("SHADOWLINE_STANDIN_PREWARM", True):
            self.worker.prewarm()
        self.lock = failover_lock.acquire(settings.lock_path(), self.cfg.engine_id, stop=self.stopping)
        if self.lock is None:
            return False
        log.info("Failover lock acquired: %s", self.lock.holder)
        log.info("[Shadow] Lock acquired, waking engine")
        self.metrics.set_state("waking")
        if self.lock.contended:
            self.metrics.record_switch_attempt()
        if self.hang_on_wake:  # like an engine stuck restoring its memory: the lock held, never active
            log.warning("fault: hang-wake: stuck while waking, holding the lock")
            self.stopping.wait()
            return False
        return True

    def _run(self) -> int:  # noqa: C901 (over the size limits of pyproject.toml; split it when it changes next)
        cfg = self.cfg
        if cfg.shadow:
            persist_dir = os.path.dirname(os.path.abspath(settings.lock_path()))
            self.metrics = FailoverMetrics(cfg.engine_id, cfg.name, cfg.component, persist_dir)
            self.metrics.set_state("init")
        if cfg.system_port:
            system_server.serve(cfg.host, cfg.system_port, self.health, self.render_metrics, self.proxy)

        self.weights.load()
        peers = {}
        if cfg.nnodes > 1:
            peers = cohort.rendezvous_leader(cfg.master_addr, cfg.master_port, self.hello(),
                                             settings.rendezvous_timeout())
        self.start_collective(peers, None)

        self.worker = Worker(cfg.model, cfg.name, cfg.host)
        if cfg.shadow and not self.park_until_the_lock():
            return self.shutdown(0)
        self.booting = False

        # Waking needs the collective: a rank that died or hangs keeps us here, holding the lock.
        if not self.collective.wait_for_progress(self.stopping):
            return self.shutdown(0)
        self.worker.start(self.lock.fd if self.lock else -1)
        if not self.worker.wait_registered(settings.worker_ready_timeout(), self.stopping):
            if self.stopping.is_set():
                return self.shutdown(0)
            if self.worker.proc.poll() is None:
                log.error("worker did not register within %.0f s", settings.worker_ready_timeout())
            return self.shutdown(1)
        self.healthy = self.serving = True
        if cfg.shadow:
            log.info("[Shadow] Engine awake, registering with discovery")
            self.metrics.set_state("active")
            if self.lock.contended:
                self.metrics.record_switch_success()
        log.info("engine %s serving %s (worker %s)", cfg.engine_id, cfg.name, self.worker.worker_id)

        while not self.stopping.wait(0.1):
            code = self.worker.proc.poll()
            if code is not None:
                log.error("worker exited with %s: the engine dies with it", code)
                return self.shutdown(1)
            worker_text = self.worker_metrics()  # vLLM updates its progress metrics at every step; so do we
            if worker_text is not None:
                self.progress.observe_worker(worker_text)
        return self.shutdown(0)

    def shutdown(self, code: int) -> int:
        self.say_why_stopping()
        self.stopping.set()
        if self.collective is not None:
            self.collective.shutdown()
        if self.worker is not None:
            self.worker.stop()
        if self.lock is not None and self.lock.held:
            self.lock.release()
            log.info("Failover lock released: %s", self.lock.holder)
        self.cleanup()
        return code


def main(argv: list[str] | None = None) -> int:
    logs.setup("shadowline.standin.engine")
    args, unknown = parse_args(argv)
    if unknown:
        log.info("ignoring arguments the stand-in does not model: %s", " ".join(unknown))
    cfg = configure(args)
    log.info("stand-in engine %s node rank %d/%d (%s), TP %d, model %s, GPUs %s, pid %d", cfg.engine_id, cfg.rank,
             cfg.nnodes, "headless" if cfg.headless else "leader", cfg.tp, cfg.name,
             ",".join(g for g, _unused in cfg.gpus), os.getpid())
    return (Headless(cfg) if cfg.headless else Leader(cfg)).run()


if __name__ == "__main__":
    raise SystemExit(main())
