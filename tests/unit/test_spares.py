"""Spare nodes (gms_spares, issue #40; docs/fleet.md, Spare nodes): the inventory contract reads them, each bad
spare is refused with its field and fix before anything changes (a spare that is also a node, one that sets a
node's rank, one whose variables are not the nodes', too few for gms_failover.min_spares, one of another GPU
count, an address another host has); the plan gives a spare a GMS server, an agent, credentials, an etcd proxy,
a NATS user and every port a rank of any replica would take, and no rank; status and the testbed show them."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from shadowline.cli import plan_lines
from shadowline.cluster.status_table import (
    render_status_table,
    status_document,
    table_failover,
    table_rows,
    table_spares,
    table_states,
)
from shadowline.control.agent_metrics import AgentMetrics
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.firewall import protected_ports
from shadowline.deployment.plan import Plan, gpu_hosts, spare_hosts
from shadowline.deployment.plan_builder import build_plan, nats_authorization
from shadowline.deployment.ports import host_port_uses
from shadowline.deployment.preflight import run_preflight
from shadowline.deployment.secrets import host_files
from testbed.inventory import inventory_text
from testbed.journal import plan as booted_state

from .helpers import hostvars


def with_spares(nodes: int = 2, spares: int = 1, **shared: Any) -> tuple[dict[str, dict[str, Any]], list[str], list[str]]:
    """hostvars of ``nodes`` nodes and ``spares`` spares after them (the nodes' variables, no rank, the next
    addresses): what group_vars/gms_spares.yml as the nodes' file gives."""
    hv, hosts = hostvars(nodes + spares, **shared)
    spare_names = hosts[nodes:]
    for host in spare_names:
        del hv[host]["gms_node_rank"]
    return hv, hosts[:nodes], spare_names


def problems_of(hv: dict[str, dict[str, Any]], nodes: list[str], spares: list[str]) -> list[str]:
    contract, problems = parse_contract(hv, nodes, [], spares)
    assert (contract is None) == bool(problems)
    return [str(p) for p in problems]


def test_a_deployment_without_spares_plans_as_before():
    hv, nodes = hostvars(2, gms_engine={"nnodes": 1, "tensor_parallel_size": 8})
    contract, problems = parse_contract(hv, nodes)
    assert problems == [] and contract.spares == ()
    plan = build_plan(contract)
    assert plan.spares == () and "spares" in plan.to_dict() and spare_hosts(plan) == []
    data = plan.to_dict()
    del data["spares"]  # a plan.json from before spares
    assert Plan.from_dict(data) == plan


def test_a_spare_gets_a_gms_server_an_agent_credentials_and_a_nodes_ports_and_no_rank():
    hv, nodes, spares = with_spares(2, 1, gms_engine={"nnodes": 1, "tensor_parallel_size": 8})
    contract, problems = parse_contract(hv, nodes, [], spares)
    assert problems == [], [str(p) for p in problems]
    assert [(s.host, s.address) for s in contract.spares] == [("node2", "198.18.0.12")]
    plan = build_plan(contract)
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert spare_hosts(plan) == ["node2"] and gpu_hosts(plan) == ["node0", "node1", "node2"]
    assert plan.gpu_node("node2").address == "198.18.0.12"
    assert [r.members for r in plan.replicas] == [("node0",), ("node1",)]  # no replica has it
    assert all(rank.host != "node2" for cohort in plan.cohorts for rank in cohort.ranks)
    assert plan.gms_server_on("node2").env == {**plan.gms_server_on("node1").env,
                                               **{k: v for k, v in plan.gms_server_on("node2").env.items()
                                                  if "node2" in v}}
    assert {p.host for p in plan.infra.etcd_proxies} == {"node0", "node1", "node2"}
    assert "node2" in nats_authorization(contract)[0]
    assert protected_ports(plan, "node2") == protected_ports(plan, "node1")
    assert {f["dest"].rsplit("/", 1)[1] for f in host_files(plan, "node2")} == {
        f["dest"].rsplit("/", 1)[1] for f in host_files(plan, "node1")}
    # a spare may take the leader's rank of any replica: the master ports are checked on it too
    owners = {use.owner for use in host_port_uses(contract)["node2"]}
    assert "cohort 0 master port" in owners and "agent metrics" in owners
    assert "spare node2 (198.18.0.12): GMS server and agent, no rank" in plan_lines(plan.to_dict())
    with pytest.raises(KeyError, match="node2 is not a node"):
        plan.node("node2")
    with pytest.raises(KeyError, match="node9 is neither a node nor a spare of deployment llama .*spares: node2"):
        plan.gpu_node("node9")


def case_also_a_node():
    hv, nodes, spares = with_spares(2, 1)
    return hv, nodes, [*spares, "node1"], [
        "gms_spares (host node1): node1 is both a node (gms_nodes) and a spare: a node holds a rank of its replica, a "
        "spare holds none until it replaces a lost node. Fix: remove node1 from gms_spares or from gms_nodes "
        "(docs/fleet.md, Spare nodes)."]


def case_a_rank():
    hv, nodes, spares = with_spares(2, 1)
    hv["node2"]["gms_node_rank"] = 2
    return hv, nodes, spares, [
        "gms_node_rank (host node2): is set on the spare node2: a spare holds no rank and no replica until relocation "
        "gives it one (the replica's membership record). Fix: remove gms_node_rank from node2, or move node2 to "
        "gms_nodes to make it a node."]


def case_another_value():
    hv, nodes, spares = with_spares(2, 1)
    hv["node2"]["gms_cohorts"] = 3
    hv["node2"]["gms_engine"] = {**hv["node2"]["gms_engine"], "gpus_per_node": 4}
    fix = ("Fix: give gms_spares the variables of gms_nodes: set them for both (group_vars/all), or make "
           "group_vars/gms_spares.yml the same file as gms_nodes.yml (docs/fleet.md, Spare nodes).")
    return hv, nodes, spares, [
        "gms_cohorts (host node2): is set on the spare, not on the nodes: a spare runs the nodes' plan and roles, and "
        f"takes the place of any of them. {fix}",
        "gms_engine (host node2): differs between the nodes and the spare: a spare runs the nodes' plan and roles, and "
        f"takes the place of any of them. {fix}"]


def case_missing_variables():
    hv, nodes, spares = with_spares(2, 1)
    hv["node2"] = {"ansible_host": "198.18.0.12"}  # group_vars of gms_nodes only
    return hv, nodes, spares, [
        f"{name} (host node2): is not set on the spare, as it is on the nodes: a spare runs the nodes' plan and roles, "
        "and takes the place of any of them. Fix: give gms_spares the variables of gms_nodes: set them for both "
        "(group_vars/all), or make group_vars/gms_spares.yml the same file as gms_nodes.yml (docs/fleet.md, Spare "
        "nodes)." for name in ("gms_deployment", "gms_engine", "gms_model")]


def pool_case(spares: int, wanted: int, have: str):
    hv, nodes, names = with_spares(2, spares, gms_failover={"min_spares": wanted})
    return hv, nodes, names, [
        f"gms_failover.min_spares: is {wanted}, but gms_spares has {have}: relocation after a lost node needs a "
        f"spare to move the rank to. Fix: add {wanted - spares} more host(s) to gms_spares, or set "
        f"gms_failover.min_spares to {spares} (docs/fleet.md, Spare nodes)."]


def case_too_few():
    return pool_case(1, 2, "1 host(s) (node2)")


def case_an_empty_pool():
    return pool_case(0, 1, "no host")


def case_a_negative_minimum():
    hv, nodes, spares = with_spares(2, 1, gms_failover={"min_spares": -1})
    return hv, nodes, spares, [
        "gms_failover.min_spares: is -1, outside 0..3600. Fix: set gms_failover.min_spares to a value in 0..3600."]


def case_a_nodes_address():
    hv, nodes, spares = with_spares(2, 1)
    hv["node2"]["ansible_host"] = "198.18.0.11"
    return hv, nodes, spares, [
        "ansible_host (host node2): node1 and node2 (node1 of gms_nodes, node2 of gms_spares) have the same address "
        "198.18.0.11 (both from ansible_host); every node needs its own: it is the master address, the address the "
        "node's engines and agent bind and the one etcd and NATS are given. Fix: set ansible_host of node2 to that "
        "node's own IP address or host name; one machine cannot be two nodes."]


@pytest.mark.parametrize("case", [case_also_a_node, case_a_rank, case_another_value, case_missing_variables,
                                  case_too_few, case_an_empty_pool, case_a_negative_minimum, case_a_nodes_address])
def test_a_bad_spare_is_refused_naming_the_field_and_the_fix(case):
    hv, nodes, spares, expected = case()
    assert problems_of(hv, nodes, spares) == expected


def facts(gpus: int) -> dict[str, Any]:
    modules = {"dynamo.vllm": True, "vllm": True, "gpu_memory_service": True}
    return {"listening": [], "gpus": [{"index": i, "memory_mib": 81920} for i in range(gpus)],
            "python": {"exists": True, "modules": modules},
            "lock_dir": {"path": "/run/x", "exists": False, "existing_ancestor": "/run", "ancestor_is_dir": True,
                         "fstype": "tmpfs", "mountpoint": "/run", "read_only": False}, "manifest_weight_bytes": None}


def test_preflight_checks_a_spare_as_a_node_and_refuses_one_of_another_gpu_count():
    hv, nodes, spares = with_spares(2, 1, gms_engine={"nnodes": 1, "tensor_parallel_size": 8})
    outcome = run_preflight(hv, nodes, [], {"node0": facts(8), "node1": facts(8), "node2": facts(8)}, spares)
    assert outcome.problems == [] and outcome.plan is not None and spare_hosts(outcome.plan) == ["node2"]
    outcome = run_preflight(hv, nodes, [], {"node0": facts(8), "node1": facts(8), "node2": facts(4)}, spares)
    assert [str(p) for p in outcome.problems] == [
        "gms_spares (host node2): the spare node2 has 4 GPU(s) (nvidia-smi), the nodes 8 (gms_engine.gpus_per_node): "
        "a spare takes a node's rank and must have its GPUs. Fix: give gms_spares hosts of 8 GPU(s), or remove node2 "
        "from gms_spares."]
    outcome = run_preflight(hv, nodes, [], {"node0": facts(8), "node1": facts(8)}, spares)
    assert [p.host for p in outcome.problems] == ["node2"]  # no facts from a spare: unreachable, refused


def test_status_prints_a_line_per_spare_that_reading_the_table_back_skips():
    ranks = [{"cohort": 0, "role": "primary", "host": "node0", "rank": 0, "pid": 10, "state": "active",
              "leader": True, "ports": {"master": 29500, "system": 8080, "nixl": 8280}}]
    spares = [{"host": "node2", "gms_server": "active", "agent": "active"},
              {"host": "node3", "gms_server": "failed", "agent": "active"}]
    text = render_status_table(ranks, "engine-0", "m@r", "automatic", spares)
    lines = text.splitlines()
    assert lines[-2:] == ["spare node2: GMS server active, agent active", "spare node3: GMS server failed, agent active"]
    rows, holder = table_rows(lines)
    assert [r[2] for r in rows] == ["node0"] and holder == "engine-0"
    assert table_states(lines) == ["active"]
    document = status_document(rows, holder, table_failover(lines), table_spares(lines))
    assert document["spares"] == spares and document["whole"] is True
    assert "spares" not in status_document(rows, holder, "automatic", table_spares(lines[:-2]))
    assert render_status_table(ranks, "engine-0", "m@r", "automatic") == "\n".join(lines[:-2])


def test_a_spares_agent_exports_its_readiness_and_every_agent_the_pools_minimum():
    spare = AgentMetrics("demo", "node4", (), spare=True, spares_wanted=1)
    node = AgentMetrics("demo", "node0", (0, 1), driver=True, spares_wanted=1)
    text = spare.render().decode()
    assert 'shadowline_agent_spare{deployment="demo",node="node4"} 1.0' in text
    assert 'shadowline_agent_spare_ready{deployment="demo",node="node4"} 0.0' in text
    spare.show_spare(ready=True)
    assert 'shadowline_agent_spare_ready{deployment="demo",node="node4"} 1.0' in spare.render().decode()
    text = node.render().decode()
    assert 'shadowline_agent_spare{deployment="demo",node="node0"} 0.0' in text
    assert 'shadowline_agent_spares_wanted{deployment="demo",node="node0"} 1.0' in text
    assert "shadowline_agent_spare_ready{" not in text  # a node is never counted as a ready spare


def test_the_testbed_writes_its_last_hosts_as_spares_that_the_contract_reads():
    state = booted_state(5, False)
    state.replicas, state.spares = 2, 1
    data = yaml.safe_load(inventory_text(state))
    children = data["all"]["children"]
    assert list(children["gms_nodes"]["hosts"]) == ["node0", "node1", "node2", "node3"]
    assert children["gms_spares"]["hosts"] == {"node4": {"ansible_host": state.hosts[4].address}}
    base, _hosts = hostvars(1, gms_engine={"tensor_parallel_size": 2, "gpus_per_node": 1})
    shared = {k: v for k, v in base["node0"].items() if k not in ("gms_node_rank", "ansible_host")}
    hv = {host: {**copy.deepcopy(shared), **values}
          for group in ("gms_nodes", "gms_spares") for host, values in children[group]["hosts"].items()}
    contract, problems = parse_contract(hv, list(children["gms_nodes"]["hosts"]), [], ["node4"])
    assert problems == [], [str(p) for p in problems]
    assert [[n.host for n in r] for r in contract.replicas] == [["node0", "node1"], ["node2", "node3"]]
    assert [s.host for s in contract.spares] == ["node4"]
    assert "gms_spares" not in inventory_text(booted_state(3, False))
