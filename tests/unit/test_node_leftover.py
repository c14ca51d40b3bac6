"""The leftover check of a failed or dead cohort (control/node_duties.py ``NodeDuties.untracked``) runs on every
view, on every node, while the other nodes still tear down. Where this agent has tracked a rank of the cohort,
the unit's cgroup is known and an empty one is a file read: ``systemctl`` is not asked. ``systemctl`` here is a
script first on PATH that logs its calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadowline.control.memory import NodeMemory
from shadowline.control.node_duties import NodeDuties

from .test_executor_launch import fake_systemctl
from .test_executor_order import two_nodes

LOGGING_SYSTEMCTL = '''#!{python}
import sys
with open({log!r}, "a") as out:
    out.write(" ".join(sys.argv[1:]) + "\\n")
'''


def own_cgroup() -> str:
    """This test's own cgroup (cgroup v2 line, else the first v1 one): one with a process in it."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v2 = [line.split(":", 2)[2] for line in lines if line.startswith("0::")]
    return v2[0] if v2 else lines[0].split(":", 2)[2]


def test_a_known_empty_unit_cgroup_is_read_not_asked_of_systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    plan, hosts = two_nodes(tmp_path)
    calls = fake_systemctl(tmp_path, monkeypatch, LOGGING_SYSTEMCTL)
    memory = NodeMemory()
    duties = NodeDuties(plan, hosts[0], memory, lambda actions: None)

    # nothing known of the unit (the agent never tracked a rank of it): systemd is asked
    assert duties.untracked(1, 3) is None  # this systemctl answers nothing: no cgroup, nothing left
    assert calls.read_text().splitlines() == [f"show {plan.unit_name('engine', 1)} --property=MainPID,ControlGroup"]
    # its cgroup known and empty (no such directory: every process gone and the unit stopped): no call
    calls.unlink()
    memory.unit_cgroups[1] = "/system.slice/shadowline-test-gone.service"
    assert duties.untracked(1, 3) is None
    assert not calls.exists(), "systemctl was asked about a unit whose known cgroup is empty"
    # its cgroup known and something runs there: systemd is asked which process is its main one
    memory.unit_cgroups[1] = own_cgroup()
    duties.untracked(1, 3)
    assert calls.read_text().splitlines() == [f"show {plan.unit_name('engine', 1)} --property=MainPID,ControlGroup"]
