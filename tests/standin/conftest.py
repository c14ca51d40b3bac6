"""Fixtures of the stand-in tests: runtime, tiny model, loopback infrastructure, process cleanup."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from . import harness


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture(scope="session")
def runtime() -> Path:
    """<repo>/.runtime, built by scripts/install-runtime if missing or stale."""
    return harness.ensure_runtime()


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("standin")


@pytest.fixture(scope="session")
def model(runtime, session_dir) -> Path:
    """A 44 MB tiny llama (4 layers, hidden 512): far more than a Python process reads to start."""
    return harness.make_model(session_dir / "tiny-model", "--layers", "4", "--hidden", "512")


def _dump(procs: harness.Procs) -> None:
    for p in procs.procs:
        print(f"----- {p.name} (pid {p.pid}, exit {p.popen.poll()}) -----\n{p.text()[-4000:]}")


@pytest.fixture(scope="session")
def session_procs(session_dir):
    procs = harness.Procs(session_dir)
    yield procs
    procs.kill_all()
    assert not procs.leftovers()


@pytest.fixture(scope="session")
def infra(runtime, session_procs, session_dir) -> harness.Infra:
    return harness.start_infra(session_procs, session_dir / "infra")


@pytest.fixture
def procs(request, tmp_path):
    """Processes of one test; every process group is killed afterwards, pass or fail."""
    procs = harness.Procs(tmp_path)
    yield procs
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        _dump(procs)
    procs.kill_all()
    assert not procs.leftovers(), "test processes survived their test"


@pytest.fixture
def short_dir():
    """A short directory for unix sockets (sun_path is limited to 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="sl-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
