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

import os
import shutil
from typing import Callable, Iterator

import pytest

import testbed.testbed as tb

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
