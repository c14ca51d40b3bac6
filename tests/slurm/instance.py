"""Testbed instance 3, the one the Slurm tests use (several engineers run testbeds on this machine at once).

``testbed.testbed`` reads ``SHADOWLINE_TESTBED`` once, at import, so setting it here would move every other test
directory of the same pytest session to instance 3 too. As tests/e2e does, ``tb`` is testbed/testbed.py loaded
as a module of its own with ``SHADOWLINE_TESTBED=3`` (198.18.3.0/24, namespaces ``sl3-node*``, state in
``.testbed-3``); ``testbed.testbed`` and the other instances are left alone.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

INSTANCE = "3"
REPO = Path(__file__).resolve().parents[2]


def load_testbed(instance: str) -> ModuleType:
    name = f"_shadowline_testbed_{instance}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "testbed" / "testbed.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = os.environ.get("SHADOWLINE_TESTBED")
    os.environ["SHADOWLINE_TESTBED"] = instance
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        if saved is None:
            del os.environ["SHADOWLINE_TESTBED"]
        else:
            os.environ["SHADOWLINE_TESTBED"] = saved
    assert module.INSTANCE == int(instance) and module.PREFIX == f"198.18.{instance}"
    return module


tb = load_testbed(INSTANCE)


def get_testbed(nodes: int = 2, slurm: bool = True):
    """A healthy instance-3 testbed of exactly this shape: the running one if it fits, else a fresh one."""
    running = tb.load_journal()
    if running is not None and ((running.nodes, running.slurm) != (nodes, slurm) or tb.problems(running)):
        tb.down()
    return tb.up(nodes, slurm)
