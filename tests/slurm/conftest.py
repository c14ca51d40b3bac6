"""Fixtures of tests/slurm.

Unit tests of the library run on loopback (a real etcd, NATS, dynamo.frontend and workers). The Slurm tests use
testbed instance 3 only (several engineers run testbeds on this machine at once), through tests/slurm/instance.py
(testbed/testbed.py bound to instance 3 as a module of its own): ``testbed`` below is testbed/pytest_fixtures.py's
fixture for that instance, and other test directories of the same session keep theirs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "plugins" / "module_utils"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from testbed.pytest_fixtures import skip_reason  # noqa: E402

from ..standin import harness  # noqa: E402
from .instance import get_testbed, tb  # noqa: E402


@pytest.fixture(scope="session")
def testbed():
    """``testbed(nodes=2, slurm=True)``: instance 3, booted or reused; torn down at the end of the session, and
    nothing of it may be left on the machine."""
    if reason := skip_reason():
        pytest.skip(reason)
    yield get_testbed
    tb.down()
    left = tb.leaks()
    assert not left, f"testbed instance 3 left things on the machine: {left}"


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture(scope="session")
def runtime() -> Path:
    return harness.ensure_runtime()


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The repo's tiny model (make runtime builds it); built here if missing."""
    path = REPO / ".cache" / "models" / "tiny-llama"
    if not (path / "config.json").exists():
        harness.make_model(path)
    return path


@pytest.fixture(scope="module")
def infra(runtime, tmp_path_factory):
    """etcd, NATS and the real dynamo.frontend on loopback, one set per test module; killed at its end."""
    workdir = tmp_path_factory.mktemp("infra")
    procs = harness.Procs(workdir)
    try:
        yield harness.start_infra(procs, workdir)
    finally:
        procs.kill_all()
        assert not procs.leftovers()


@pytest.fixture
def procs(request, tmp_path):
    """Processes of one test; every process group is killed afterwards, pass or fail."""
    procs = harness.Procs(tmp_path)
    yield procs
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for p in procs.procs:
            print(f"----- {p.name} (pid {p.pid}, exit {p.popen.poll()}) -----\n{p.text()[-3000:]}")
    procs.kill_all()
    assert not procs.leftovers(), "test processes survived their test"


@pytest.fixture
def short_dir():
    """A short directory for unix sockets (sun_path is limited to 108 bytes)."""
    import shutil
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="sl-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
