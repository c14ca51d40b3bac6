"""The stand-in engine refuses what dynamo.vllm refuses, with a clear message."""

from __future__ import annotations

import os
import subprocess

import pytest

from . import harness


def run(model, args, **env):
    base = {"PATH": os.environ["PATH"], "DYN_SYSTEM_HOST": "127.0.0.1"}
    return subprocess.run([str(harness.RUNTIME_PY), "-m", "shadowline.standin.engine", "--model", str(model), *args],
                          env={**base, **env}, capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("args,env,message", [
    (["--load-format", "auto"], {"DYN_VLLM_GMS_SHADOW_MODE": "true"}, "--gms-shadow-mode requires --load-format gms"),
    (["--load-format", "safetensors", "--gms-shadow-mode"], {}, "--gms-shadow-mode requires --load-format gms"),
    (["--load-format", "gms"], {"DYN_GMS_USE_V1": "true"}, "DYN_GMS_USE_V1=true cannot be combined"),
    (["--load-format", "gms", "--tensor-parallel-size", "2"], {"SHADOWLINE_STANDIN_GPUS": "GPU-a"},
     "needs SHADOWLINE_STANDIN_GPUS to list at least 2"),
    (["--load-format", "gms", "--nnodes", "2", "--node-rank", "1", "--distributed-executor-backend", "mp",
      "--tensor-parallel-size", "2"], {"SHADOWLINE_STANDIN_GPUS": "GPU-a"}, "--headless goes with every --node-rank"),
    (["--load-format", "gms", "--nnodes", "2", "--tensor-parallel-size", "3", "--distributed-executor-backend", "mp"],
     {}, "not divisible by --nnodes"),
    (["--load-format", "gms"], {"ENGINE_ID": "primary"}, "ENGINE_ID='primary' is not a non-negative integer"),
])
def test_bad_input_is_refused(model, runtime, args, env, message):
    r = run(model, args, **env)
    assert r.returncode != 0 and message in r.stderr, r.stderr


def test_missing_model_dir(tmp_path, runtime):
    r = run(tmp_path / "nope", ["--load-format", "gms"], SHADOWLINE_STANDIN_GPUS="GPU-a")
    assert r.returncode != 0 and "is not a directory" in r.stderr
