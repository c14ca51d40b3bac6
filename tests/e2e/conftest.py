"""Fixtures of the end-to-end tests on the multi-host testbed (run as root).

These tests use their own testbed instance (``launch.INSTANCE``: ``SHADOWLINE_E2E_TESTBED``, default 1) through
``launch.tb``, a copy of testbed/testbed.py bound to that instance, so that test directories using the default
instance can run in the same pytest session. ``testbed`` below is testbed/pytest_fixtures.py's fixture for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.pytest_fixtures import skip_reason

from . import launch

tb = launch.tb


def get_testbed(nodes: int = 3, slurm: bool = False) -> Any:
    """A healthy testbed of exactly this shape (``tb.State``): the running one if it fits, else a fresh one."""
    running = tb.load_journal()
    if running is not None and ((running.nodes, running.slurm) != (nodes, slurm) or tb.problems(running)):
        tb.down()
    return tb.up(nodes, slurm)


@pytest.fixture(scope="session")
def testbed() -> Iterator[Callable[..., Any]]:
    """``testbed(nodes=2, slurm=False)`` boots (or reuses) the hosts; at the end of the session they are torn
    down and nothing of them may be left on the machine."""
    if reason := skip_reason():
        pytest.skip(reason)
    yield get_testbed
    tb.down()
    left = tb.leaks()
    assert not left, f"the testbed (instance {launch.INSTANCE}) left things on the machine: {left}"


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"


@pytest.fixture(scope="session")
def standin_runtime() -> Path:
    """The engines' interpreter (``.runtime``: Dynamo 1.6.1 on CPU, ``shadowline`` importable), as `make runtime`
    builds it; a no-op when it is current."""
    _run([str(launch.REPO / "scripts" / "install-runtime")])
    return launch.RUNTIME_PY


def ensure_model(directory: Path, *args: str) -> Path:
    """A tiny model made locally by scripts/make-tiny-model (deterministic), kept in .cache between runs."""
    if (directory / "model.safetensors.index.json").exists():
        return directory
    scratch = directory.with_name(f"{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    _run([str(launch.RUNTIME_PY), str(launch.REPO / "scripts" / "make-tiny-model"), str(scratch), *args])
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(scratch, directory)
    return directory


@pytest.fixture(scope="session")
def standin_model(standin_runtime) -> Path:
    """The 44 MB tiny llama (``launch.SIZED_MODEL``), on the machine's disk, which every host sees."""
    return ensure_model(launch.SIZED_MODEL, *launch.SIZED_MODEL_ARGS)
