"""Pytest fixtures for tests that need testbed hosts.

In a conftest.py (with the repo root on sys.path):

    from testbed.pytest_fixtures import testbed  # noqa: F401  (the fixture)

    def test_x(testbed):
        state = testbed(nodes=3, slurm=False)   # boots, or reuses a healthy running testbed of that shape
        ...

The fixture is session-scoped: at the end of the session it tears the testbed down and fails if anything of it is
left on the machine.  Tests are skipped when not run as root or when the packages are missing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

import pytest

import testbed.testbed as tb


def load_testbed(instance: int | str) -> ModuleType:
    """testbed/testbed.py bound to one testbed instance, as a module of its own.

    The testbed reads SHADOWLINE_TESTBED once, when its package is imported (testbed/names.py); test directories
    that need their own instance (so that their hosts and deployments never meet another directory's) load their
    own copy of the whole package with this, under the name _shadowline_testbed_<i>, and the whole suite still
    runs in one pytest session. Returns that copy's testbed.py (the package's one namespace).
    """
    package = f"_shadowline_testbed_{instance}"
    facade = f"{package}.testbed"
    if facade in sys.modules:
        return sys.modules[facade]
    here = Path(__file__).resolve().parent
    spec = importlib.util.spec_from_file_location(package, here / "__init__.py", submodule_search_locations=[str(here)])
    assert spec is not None and spec.loader is not None
    saved = os.environ.get("SHADOWLINE_TESTBED")
    os.environ["SHADOWLINE_TESTBED"] = str(instance)
    sys.modules[package] = importlib.util.module_from_spec(spec)  # dataclasses look their module up while it runs
    try:
        spec.loader.exec_module(sys.modules[package])
        return importlib.import_module(facade)
    except BaseException:
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]
        raise
    finally:
        if saved is None:
            del os.environ["SHADOWLINE_TESTBED"]
        else:
            os.environ["SHADOWLINE_TESTBED"] = saved


Factory = Callable[..., tb.State]


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the testbed needs root"
    for tool in ("ip", "unshare", "nsenter", "ssh", "/usr/sbin/sshd", "/lib/systemd/systemd"):
        if shutil.which(tool) is None and not os.path.exists(tool):
            return f"{tool} is missing: run `testbed/testbed.py install-packages`"
    return None


def get_testbed(nodes: int = 3, slurm: bool = False) -> tb.State:
    """A healthy testbed of exactly this shape: the running one if it fits, else a fresh one."""
    running = tb.load_journal()
    if running is not None and ((running.nodes, running.slurm) != (nodes, slurm) or tb.problems(running)):
        tb.down()
    return tb.up(nodes, slurm)


@pytest.fixture(scope="session")
def testbed() -> Iterator[Factory]:
    if reason := skip_reason():
        pytest.skip(reason)
    yield get_testbed
    tb.down()
    left = tb.leaks()
    assert not left, f"the testbed left things on the machine: {left}"
