"""The runtime check python_env ends with (shadowline.deployment.runtime_check), run by a real interpreter: the
stand-in's runtime (.runtime, built by `make runtime`) runs the stand-in and lacks what dynamo_vllm needs, and the
dev venv (no ai-dynamo) lacks even the stand-in's. What is missing is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / ".runtime" / "bin" / "python"


def check(python: str, backend: str, gpus: int = 0) -> tuple[int, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins" / "module_utils")}
    proc = subprocess.run([python, "-m", "shadowline.deployment.runtime_check", "--backend", backend, "--gpus",
                           str(gpus)], capture_output=True, text=True, env=env, check=False, timeout=120)
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.skipif(not RUNTIME.exists(), reason="make runtime builds .runtime")
def test_the_standin_runtime_runs_the_standin_and_not_dynamo_vllm():
    rc, result = check(str(RUNTIME), "standin")
    assert (rc, result["missing"], result["cuda_devices"]) == (0, [], None), result
    rc, result = check(str(RUNTIME), "dynamo_vllm", gpus=8)
    assert rc == 1
    assert [m.split(" ")[0] for m in result["missing"]] == ["vllm", "gpu_memory_service"], result


def test_an_environment_without_dynamo_is_named():
    rc, result = check(sys.executable, "standin")
    assert rc == 1 and result["missing"] == ["dynamo (ModuleNotFoundError: No module named 'dynamo')"]
