"""NVIDIA Dynamo with vLLM (`python -m dynamo.vllm`) and the real GMS server. Real vLLM ranks expose no
per-rank progress file: a hang is seen by process exit, the leader's /health, and the progress metrics vLLM
exports through the leader's Dynamo system port (docs/detection.md). The plan renders torch's NCCL watchdog
settings and vLLM's process-group timeout, so that a rank stuck in a collective ends its process."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Backend

# torch's ProcessGroupNCCL reads these (torch/csrc/distributed/c10d/ProcessGroupNCCL.{hpp,cpp}; vLLM 0.31.0 pins
# torch 2.13.0). After a collective outlives the process group's timeout the watchdog thread sleeps 4 times
# TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC (default 15000: a minute) for the flight recorder's dump, then tears the
# process down; 1000 makes that 4 s.
ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
ENABLE_MONITORING = "TORCH_NCCL_ENABLE_MONITORING"
HEARTBEAT_TIMEOUT = "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"
DUMP_WAIT_MS = "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"
# 3 = SkipCleanUp: tear the process down without ncclCommAbort (which can itself hang on a wedged peer); torch's
# default, written out so an image or a site profile that sets 0 (no handling) or 2 (clean up only, no exit)
# does not switch the exit off. 1 (TearDown) aborts the communicators first; nothing here needs them clean.
TEARDOWN_WITHOUT_CLEANUP = 3
DUMP_WAIT_MILSEC = 1000
# vLLM 0.31.0 passes this flag to torch.distributed.init_process_group as the timeout (ParallelConfig.
# distributed_timeout_seconds; torch's NCCL default is 600 s).
TIMEOUT_FLAG = "--distributed-timeout-seconds"


def nccl_watchdog_env(collective_timeout_s: int) -> dict[str, str]:
    """torch's NCCL watchdog, set to end a rank whose collective is stuck: the watchdog tears the process down
    after the process group's timeout plus 4 x the dump wait; the monitor thread (enabled) ends it when the
    watchdog thread itself is stuck that long."""
    return {
        ASYNC_ERROR_HANDLING: str(TEARDOWN_WITHOUT_CLEANUP),
        ENABLE_MONITORING: "1",
        HEARTBEAT_TIMEOUT: str(int(collective_timeout_s)),
        DUMP_WAIT_MS: str(DUMP_WAIT_MILSEC),
    }


def exit_after_s(collective_timeout_s: float, dump_wait_ms: float = DUMP_WAIT_MILSEC) -> float:
    """When a rank whose collective stopped ends, by torch's watchdog: the timeout, then 4 dump waits."""
    return float(collective_timeout_s) + 4 * dump_wait_ms / 1000.0


def gpu_env(gpus_per_node: int) -> dict[str, str]:
    """Which GPUs the GMS server and every rank on a node use, the same for all of them: the node's first
    ``gpus_per_node`` in PCI bus order. GMS names its sockets by NVML GPU UUID (``gms_<UUID>_weights.sock``) while
    an engine picks its device by CUDA index; CUDA's own order (fastest first) need not be NVML's, so both are
    pinned to the bus order that nvidia-smi and NVML list (the mapping NVIDIA's Slurm runner pins per worker)."""
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus_per_node))}


@dataclass(frozen=True)
class DynamoVllm(Backend):
    def node_env(self, deployment: str, host: str, gpus_per_node: int) -> dict[str, str]:
        return gpu_env(gpus_per_node)

    def watchdog_env(self, collective_timeout_s: int) -> dict[str, str]:
        return nccl_watchdog_env(collective_timeout_s)

    def watchdog_args(self, collective_timeout_s: int) -> tuple[str, ...]:
        return (TIMEOUT_FLAG, str(int(collective_timeout_s)))


# Dynamo 1.6.1 has no rank liveness (DYN_GMS_RANK_LIVENESS) and no serving NCCL timeout
# (DYN_GMS_SERVING_NCCL_TIMEOUT_S): neither string is in its wheels, so neither is rendered (docs/detection.md).
DYNAMO_VLLM = DynamoVllm(name="dynamo_vllm", engine_module="dynamo.vllm", gms_module="gpu_memory_service.cli.server",
                         runtime_modules=("dynamo.vllm", "vllm", "gpu_memory_service"), progress_metrics_path="/metrics",
                         runtime_distributions=("ai-dynamo", "ai-dynamo-runtime", "vllm", "gpu-memory-service", "torch"))
