"""The interface every engine backend implements (see backends/__init__.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PolledGpuEvents:
    """A backend's own GPU event source, opened, which the node agent's listener polls (control/gpu_watch.py)."""
    name: str  # what it is, for the listener's gpu-watch-started notice
    poll: Callable[[], list[Any]]  # the faults (common/gpu_health.GpuFault) seen since the last call
    pause_s: float  # between two polls


@dataclass(frozen=True)
class Backend:
    name: str
    engine_module: str  # `python -m <engine_module>` runs one rank of a cohort
    gms_module: str  # `python -m <gms_module>` runs the node's GPU Memory Service server
    runtime_modules: tuple[str, ...]  # what the runtime's interpreter must import (preflight asks it)
    # The Python distributions the runtime is built from: what a wheelhouse (python_env_mode wheelhouse) must hold
    # a wheel of, by project name (preflight looks before anything is installed).
    runtime_distributions: tuple[str, ...] = ("ai-dynamo",)
    uses_gpus: bool = True  # its ranks take GPUs (a Slurm job asks for them; the stand-in runs on CPUs)
    # Where the leader's system server serves vLLM's progress metrics (vllm:num_requests_running,
    # vllm:generation_tokens_total; common/progress.py judges them), or None: the engine has no such signal.
    progress_metrics_path: str | None = None
    # Where the node agent hears of GPU faults (control/gpu_watch.py): nvml (NVML's events, else the kernel log),
    # the backend's own source (gpu_event_source; the stand-in's "fake": its event file, which drills append to) or
    # none.
    gpu_events: str = "nvml"

    def gpu_event_source(self, state_dir: str) -> PolledGpuEvents | None:
        """The backend's own GPU event source, opened (the listener calls this on its thread as it starts), for a
        ``gpu_events`` that is neither nvml nor none (None: the backend has none; the listener uses gpu_events)."""
        return None

    def node_env(self, deployment: str, host: str, gpus_per_node: int) -> dict[str, str]:
        """Environment the GMS server and every rank on a node get on top of the plan's own."""
        return {}

    def watchdog_env(self, collective_timeout_s: int) -> dict[str, str]:
        """Environment every rank gets so that a rank stuck in a collective ends its process (gms_failover.
        collective_timeout_s), where the engine has such a watchdog ({}: it has none)."""
        return {}

    def watchdog_args(self, collective_timeout_s: int) -> tuple[str, ...]:
        """Engine flags that set the collectives' timeout (the process group's), where the engine takes one."""
        return ()

    def rank_fault_file(self, lock_dir: str, engine_id: int | str, node_rank: int) -> str | None:
        """A control file through which a drill makes one rank misbehave (hang its collective), when the backend
        has one (None: it has no such hook, and drills that need it refuse to run)."""
        return None

    def fake_gpu_uuids(self, deployment: str, host: str, gpus_per_node: int) -> list[str]:
        """The GPU UUIDs a drill may write fake GPU events for ([]: real GPUs, whose events NVML delivers)."""
        return []

    def weights_resident(self, socket_dir: str) -> bool | None:
        """Whether the node's GMS server holds committed weights, when the backend can tell (None: unknown)."""
        return None

    def runs(self, argv: list[str] | tuple[str, ...]) -> bool:
        """Whether a command line is one rank of this backend (the Slurm watchdog sees only argv)."""
        return any(a == self.engine_module or a.endswith("." + self.engine_module) for a in argv)
