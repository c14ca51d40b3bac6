"""The CPU stand-in (`python -m shadowline.standin.engine`): the same flags and environment as dynamo.vllm (torch's
NCCL watchdog settings included, which the stand-in emulates), fake GPU UUIDs, vLLM's progress metrics on the
leader's system port. It offers the agent no signal a real engine lacks: the collective heartbeat file each rank
rewrites is the stand-in's own business (its tests read it); the agent judges it as it judges dynamo.vllm."""

from __future__ import annotations

import glob
import os
import uuid
from dataclasses import dataclass

from .base import Backend, PolledGpuEvents
from .dynamo_vllm import TIMEOUT_FLAG, nccl_watchdog_env

GPU_NAMESPACE = uuid.UUID("5d0c3c36-6f1e-4a53-9a3c-2f6b1f0a7e21")


def gpu_uuids(deployment: str, host: str, count: int) -> list[str]:
    """Stable fake GPU UUIDs for the stand-in (real GPUs report their own through NVML)."""
    return [f"GPU-{uuid.uuid5(GPU_NAMESPACE, f'{deployment}/{host}/{i}')}" for i in range(count)]


@dataclass(frozen=True)
class Standin(Backend):
    def node_env(self, deployment: str, host: str, gpus_per_node: int) -> dict[str, str]:
        return {"SHADOWLINE_STANDIN_GPUS": ",".join(gpu_uuids(deployment, host, gpus_per_node))}

    def watchdog_env(self, collective_timeout_s: int) -> dict[str, str]:
        return nccl_watchdog_env(collective_timeout_s)  # read by the stand-in's emulated watchdog (standin/settings)

    def watchdog_args(self, collective_timeout_s: int) -> tuple[str, ...]:
        return (TIMEOUT_FLAG, str(int(collective_timeout_s)))

    def fake_gpu_uuids(self, deployment: str, host: str, gpus_per_node: int) -> list[str]:
        return gpu_uuids(deployment, host, gpus_per_node)

    def rank_fault_file(self, lock_dir: str, engine_id: int | str, node_rank: int) -> str | None:
        from ..standin.faults import rank_fault_path  # noqa: PLC0415 (the stand-in's own file name)
        return rank_fault_path(engine_id, node_rank, lock_dir)

    def gpu_event_source(self, state_dir: str) -> PolledGpuEvents | None:
        """The stand-in's GPU event file in the state dir, read from its end (drills append to it)."""
        from ..standin.gpu_events import FAKE_POLL_S, FakeEvents, fake_events_path  # noqa: PLC0415 (only where it runs)
        path = fake_events_path(state_dir)
        return PolledGpuEvents(f"the stand-in's GPU event file {path}", FakeEvents(path).poll, FAKE_POLL_S)

    def weights_resident(self, socket_dir: str) -> bool | None:
        """Every weights socket of the stand-in's GMS server answers with committed weights."""
        from ..standin import gms_client  # noqa: PLC0415 (the stand-in's client, only where it runs)
        resident = []
        for path in sorted(glob.glob(os.path.join(socket_dir, "gms_*_weights.sock"))):
            try:
                resident.append(bool(gms_client.status(path, timeout=0.5).get("committed")))
            except (OSError, gms_client.GMSError):
                resident.append(False)
        return all(resident) if resident else False


STANDIN = Standin(name="standin", engine_module="shadowline.standin.engine",
                  gms_module="shadowline.standin.gms_server", runtime_modules=(), uses_gpus=False,
                  progress_metrics_path="/metrics", gpu_events="fake")
