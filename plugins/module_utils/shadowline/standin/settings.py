"""Environment of the stand-in processes: one place that reads every variable they honour."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

from ..common.values import as_bool
from .faults import rank_fault_path

GMS_TAGS = ("weights", "kv_cache")
DEFAULT_LOCK_PATH = "/shared/failover.lock"  # upstream's default


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if not raw:
        return default
    return as_bool(raw) is True  # the contract's boolean words (true/yes/on/1); anything else is false


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"error: {name}={raw!r} is not a number") from None


def standin_gpus() -> list[str]:
    """The node's fake GPU UUIDs (``SHADOWLINE_STANDIN_GPUS``, comma-separated), in device order."""
    return [g.strip() for g in os.environ.get("SHADOWLINE_STANDIN_GPUS", "").split(",") if g.strip()]


def gms_socket_dir() -> str:
    """``GMS_SOCKET_DIR``, else the temp dir (upstream's default)."""
    return os.environ.get("GMS_SOCKET_DIR") or tempfile.gettempdir()


def gms_socket_path(gpu_uuid: str, tag: str = "weights", socket_dir: str | None = None) -> str:
    """``<GMS_SOCKET_DIR>/gms_<GPU-UUID>_<tag>.sock``, as upstream names them."""
    return os.path.join(socket_dir or gms_socket_dir(), f"gms_{gpu_uuid}_{tag}.sock")


def gms_ready_marker(socket_dir: str | None = None) -> str:
    """Written by the stand-in GMS server once every socket listens (upstream writes none)."""
    return os.path.join(socket_dir or gms_socket_dir(), "gms_ready")


def system_host() -> str:
    """Address for every listener of an engine: ``DYN_SYSTEM_HOST``, else loopback (never 0.0.0.0)."""
    host = os.environ.get("DYN_SYSTEM_HOST", "").strip()
    return host if host and host not in ("0.0.0.0", "::") else "127.0.0.1"


def lock_path() -> str:
    return os.environ.get("FAILOVER_LOCK_PATH") or DEFAULT_LOCK_PATH


def state_dir() -> str:
    """Where heartbeat and fault-control files live: ``SHADOWLINE_STANDIN_STATE_DIR``, else the lock
    file's directory, else ``GMS_SOCKET_DIR``/temp dir (headless ranks may have no lock path)."""
    explicit = os.environ.get("SHADOWLINE_STANDIN_STATE_DIR")
    if explicit:
        return explicit
    if os.environ.get("FAILOVER_LOCK_PATH"):
        return os.path.dirname(os.path.abspath(os.environ["FAILOVER_LOCK_PATH"]))
    return gms_socket_dir()


def heartbeat_path(engine_id: int | str, rank: int, directory: str | None = None) -> str:
    """The rank's collective heartbeat file (in the failover lock's directory): the stand-in's own record of its
    collective steps, for its tests; no agent reads it (no real engine writes one)."""
    return os.path.join(directory or state_dir(), f"heartbeat-engine-{engine_id}-rank-{rank}")


def fault_paths(engine_id: str, rank: int, directory: str | None = None) -> list[str]:
    """Control files a rank watches: one for itself, one for its whole engine on this host."""
    d = directory or state_dir()
    return [rank_fault_path(engine_id, rank, d), os.path.join(d, f"fault-engine-{engine_id}")]


def on_peer_death() -> str:
    mode = os.environ.get("SHADOWLINE_STANDIN_ON_PEER_DEATH", "hang").strip().lower() or "hang"
    if mode not in ("hang", "exit"):
        raise SystemExit(f"error: SHADOWLINE_STANDIN_ON_PEER_DEATH must be hang or exit, not {mode!r}")
    return mode


def gms_timeout() -> float:
    """How long an import waits for a GMS server and a committed layout (upstream: 30 s admission)."""
    return env_float("SHADOWLINE_STANDIN_GMS_TIMEOUT", 30.0)


def heartbeat_interval() -> float:
    return env_float("SHADOWLINE_STANDIN_HEARTBEAT_INTERVAL", 0.05)


def collective_timeout() -> float:
    """With ON_PEER_DEATH=exit, a collective stalled this long also exits (0: only on peer death)."""
    return env_float("SHADOWLINE_STANDIN_COLLECTIVE_TIMEOUT", 0.0)


@dataclass(frozen=True)
class NcclWatchdog:
    """torch's NCCL watchdog as the stand-in emulates it, from the same environment and flag real ranks get
    (backends/dynamo_vllm.py): a collective stuck longer than ``timeout_s`` ends the process ``dump_wait_s`` x 4
    later, when the error handling mode tears down (1 or 3; torch's default is 3)."""
    timeout_s: float  # the process group's timeout (--distributed-timeout-seconds; torch's NCCL default 600 s)
    teardown: bool  # TORCH_NCCL_ASYNC_ERROR_HANDLING 1 (TearDown) or 3 (SkipCleanUp): the process is ended
    dump_wait_s: float  # TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC / 1000 (default 15 s); the watchdog sleeps 4 of them

    @property
    def exit_after_s(self) -> float:
        return self.timeout_s + 4 * self.dump_wait_s


def nccl_watchdog(process_group_timeout_s: float | None) -> NcclWatchdog:
    """The emulated watchdog of a rank started with ``--distributed-timeout-seconds`` (None: torch's default)."""
    mode = env_float("TORCH_NCCL_ASYNC_ERROR_HANDLING", 3.0)
    return NcclWatchdog(timeout_s=float(process_group_timeout_s or 600.0), teardown=int(mode) in (1, 3),
                        dump_wait_s=env_float("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", 15000.0) / 1000.0)


def load_delay() -> float:
    """Extra seconds of weight loading (a slow real engine: vLLM answers /health 503 and beats nothing meanwhile)."""
    return env_float("SHADOWLINE_STANDIN_LOAD_DELAY", 0.0)


def rendezvous_timeout() -> float:
    return env_float("SHADOWLINE_STANDIN_RENDEZVOUS_TIMEOUT", 600.0)


def worker_ready_timeout() -> float:
    return env_float("SHADOWLINE_STANDIN_WORKER_TIMEOUT", 120.0)
