"""Testbed instance 3, the one the Slurm tests use (several engineers run testbeds on this machine at once).

``testbed.testbed`` reads ``SHADOWLINE_TESTBED`` once, at import, so setting it here would move every other test
directory of the same pytest session to instance 3 too. As tests/e2e does, ``tb`` is testbed/testbed.py loaded
as a module of its own with ``SHADOWLINE_TESTBED=3`` (198.18.3.0/24, namespaces ``sl3-node*``, state in
``.testbed-3``); ``testbed.testbed`` and the other instances are left alone.
"""

from __future__ import annotations

from testbed.instances import load_testbed

INSTANCE = "3"

tb = load_testbed(INSTANCE)
assert tb.INSTANCE == int(INSTANCE) and tb.PREFIX == f"198.18.{INSTANCE}"


def get_testbed(nodes: int = 2, slurm: bool = True):
    """A healthy instance-3 testbed of exactly this shape: the running one if it fits, else a fresh one."""
    running = tb.load_journal()
    if running is not None and ((running.nodes, running.slurm) != (nodes, slurm) or tb.problems(running)):
        tb.down()
    return tb.up(nodes, slurm)
