"""NVIDIA Dynamo with vLLM (`python -m dynamo.vllm`) and the real GMS server. Real vLLM ranks expose no
per-rank progress file: a hang is seen by process exit and the leader's /health only."""

from __future__ import annotations

from .base import Backend

DYNAMO_VLLM = Backend(name="dynamo_vllm", engine_module="dynamo.vllm", gms_module="gpu_memory_service.cli.server",
                      runtime_modules=("dynamo.vllm", "gpu_memory_service"))
