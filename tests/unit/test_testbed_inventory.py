"""The inventory `make testbed-up` writes (testbed/inventory.py): without REPLICAS what it always wrote (one engine
group ranked by gms_node_rank); with REPLICAS=r a fleet of r replicas that the inventory contract reads as such;
a REPLICAS that does not divide NODES is refused before anything boots."""

from __future__ import annotations

import copy

import pytest
import yaml

import testbed.lifecycle as lifecycle
from shadowline.deployment.contract import parse_contract
from testbed.errors import TestbedError as RefusedByTestbed
from testbed.inventory import inventory_text
from testbed.journal import plan

from .helpers import hostvars


def contract_of(text: str):
    """The contract of the written inventory, its hosts' variables over the unit tests' usual ones (the testbed's
    group_vars set the tensor parallel size from testbed_replica_nodes)."""
    data = yaml.safe_load(text)
    base, _hosts = hostvars(1)
    shared = {k: v for k, v in base["node0"].items() if k not in ("gms_node_rank", "ansible_host")}
    size = data["all"]["vars"].get("testbed_replica_nodes", len(data["all"]["children"]["gms_nodes"]["hosts"]))
    shared["gms_engine"] = {**shared.get("gms_engine", {}), "tensor_parallel_size": size, "gpus_per_node": 1}
    nodes = data["all"]["children"]["gms_nodes"]["hosts"]
    hv = {host: {**copy.deepcopy(shared), **values} for host, values in nodes.items()}
    return parse_contract(hv, list(nodes))


def test_without_replicas_the_inventory_is_one_engine_group_as_before():
    text = inventory_text(plan(3, False))
    assert "gms_replica" not in text and "testbed_replica_nodes" not in text
    assert "gms_node_rank: 2}" in text
    contract, problems = contract_of(text)
    assert problems == [] and [[n.host for n in r] for r in contract.replicas] == [["node0", "node1", "node2"]]


def test_replicas_2_of_4_nodes_is_a_fleet_of_two_2_node_replicas():
    state = plan(4, False)
    state.replicas = 2
    text = inventory_text(state)
    assert "testbed_replica_nodes: 2" in text
    contract, problems = contract_of(text)
    assert problems == [], [str(p) for p in problems]
    assert contract.engine.nnodes == 2
    assert [[(n.host, n.rank) for n in r] for r in contract.replicas] == [
        [("node0", 0), ("node1", 1)], [("node2", 0), ("node3", 1)]]


@pytest.mark.parametrize(("nodes", "replicas"), [(4, 3), (3, 0), (2, -1)])
def test_replicas_that_do_not_divide_the_nodes_are_refused_before_anything_boots(nodes: int, replicas: int,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(lifecycle, "require_root", lambda: None)
    monkeypatch.setattr(lifecycle, "locked", lambda: pytest.fail("up took the testbed's lock: it went on"))
    with pytest.raises(RefusedByTestbed, match=f"--replicas {replicas} does not split the {nodes} nodes"):
        lifecycle.up(nodes, replicas=replicas)
