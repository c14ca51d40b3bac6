"""--slurm: munge + slurmctld on node0 + slurmd on every host; jobs span the hosts."""

from __future__ import annotations

import pytest

import testbed.testbed as tb

pytestmark = pytest.mark.timeout(120)


def on_node0(state: tb.State, *argv: str) -> str:
    proc = tb.exec_in("node0", argv, timeout=60)
    assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize("nodes", [2, 3])
def test_slurm_nodes_idle_and_a_job_spans_two_hosts(testbed, nodes):
    state = testbed(nodes=nodes, slurm=True)
    sinfo = on_node0(state, "sinfo", "-h", "-N", "-o", "%N %P %t")
    assert sorted(sinfo.split("\n")[:-1]) == [f"node{i} gpu* idle" for i in range(nodes)]
    out = on_node0(state, "srun", "-N2", "hostname")
    assert sorted(out.split()) == ["node0", "node1"]
    out = on_node0(state, "srun", f"-N{nodes}", "hostname")
    assert sorted(out.split()) == [h.name for h in state.hosts]


def test_slurm_units_where_they_belong(testbed):
    state = testbed(nodes=3, slurm=True)
    for host in state.hosts:
        proc = tb.exec_in(host.name, ["systemctl", "is-active", "munge", "slurmd", "slurmctld"], timeout=30)
        expected = ["active", "active", "active" if host.index == 0 else "inactive"]
        assert proc.stdout.split() == expected, host.name
    inventory = tb.INVENTORY.read_text()
    assert "slurm_controller: {hosts: {node0: {}}}" in inventory
    assert "slurm_compute: {hosts: {node0: {}, node1: {}, node2: {}}}" in inventory
