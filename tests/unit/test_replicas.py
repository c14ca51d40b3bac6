"""The fleet's inventory contract and the plan's replica level (docs/fleet-design.md, step 2): gms_nodes holds
replicas of gms_engine.nnodes nodes, from gms_node_rank's order or from gms_replica and gms_replica_rank on every
node; each bad fleet inventory is refused with its field and fix; one replica is today's plan, to the byte."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from shadowline.cli import plan_lines
from shadowline.control.failure_notices import sender_node
from shadowline.control.metrics_server import Peer
from shadowline.deployment import preflight
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan import Plan, sole_replica
from shadowline.deployment.plan_builder import build_plan
from shadowline.deployment.ports import port_problems
from shadowline.deployment.preflight import fleet_refusal

from .helpers import hostvars


def fleet(nodes: int, nnodes: int | None, places: list[tuple[Any, Any]] | None = None, **shared: Any
          ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """hostvars of ``nodes`` hosts; with ``places``, each host's (gms_replica, gms_replica_rank) instead of its
    gms_node_rank (None: the variable left out)."""
    engine = {"tensor_parallel_size": 8 * (nnodes or nodes)} | ({"nnodes": nnodes} if nnodes else {})
    hv, hosts = hostvars(nodes, gms_engine=engine, **shared)
    for host, place in zip(hosts, places or []):
        del hv[host]["gms_node_rank"]
        for name, value in zip(("gms_replica", "gms_replica_rank"), place):
            if value is not None:
                hv[host][name] = value
    return hv, hosts


def parsed(hv: dict[str, dict[str, Any]], hosts: list[str], infra: list[str] | None = None):
    contract, problems = parse_contract(hv, hosts, infra)
    assert problems == [], [str(p) for p in problems]
    assert contract is not None
    return contract


def listed_twice() -> tuple[dict[str, dict[str, Any]], list[str]]:
    hv, hosts = fleet(2, 1)
    return hv, [*hosts, hosts[0]]


def rank_twice() -> tuple[dict[str, dict[str, Any]], list[str]]:
    hv, hosts = fleet(2, 1)
    hv["node1"]["gms_node_rank"] = 0
    return hv, hosts


def rank_also(place: int) -> tuple[dict[str, dict[str, Any]], list[str]]:
    hv, hosts = fleet(2, 1, [(0, 0), (1, 0)])
    hv["node1"]["gms_node_rank"] = place
    return hv, hosts


# (case, the inventory, the problem's field, words of its message)
REFUSALS = [
    ("a replica short of a node", lambda: fleet(3, 2), "gms_engine.nnodes",
     "is 2 but gms_nodes has 3 hosts. gms_engine.nnodes is the size of one replica"),
    ("fewer hosts than one replica", lambda: fleet(2, 3), "gms_engine.nnodes",
     "is 3 but gms_nodes has 2 hosts."),
    ("a named replica short of a node", lambda: fleet(3, 2, [(0, 0), (0, 1), (1, 0)]), "gms_replica",
     "replica 1 has 1 node(s) (node2) but gms_engine.nnodes is 2: it is 1 node(s) short."),
    ("replicas of different sizes", lambda: fleet(5, 2, [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]), "gms_replica",
     "gives replicas of different sizes: replica 0 has 3 (node0, node1 and node2), replica 1 has 2"),
    ("a replica larger than nnodes", lambda: fleet(5, 2, [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]), "gms_replica",
     "replica 0 has 3 nodes (node0, node1 and node2), more than gms_engine.nnodes (2)."),
    ("a node in two replicas", lambda: fleet(2, 1, [([0, 1], 0), (1, 0)]), "gms_replica",
     "a node belongs to one replica only."),
    ("a host listed twice", listed_twice, "gms_nodes", "lists node0 more than once"),
    ("a rank twice in a replica", lambda: fleet(2, 2, [(0, 0), (0, 0)]), "gms_replica_rank",
     "rank 0 of replica 0 is given to node0 and node1"),
    ("a rank outside 0..nnodes-1", lambda: fleet(2, 2, [(0, 0), (0, 2)]), "gms_replica_rank",
     "replica 0's ranks must be 0..1 (rank 0 is its leader node); got [0, 2], missing [1]."),
    ("a replica without its leader", lambda: fleet(4, 2, [(0, 0), (0, 1), (1, 1), (1, 1)]), "gms_replica_rank",
     "replica 1's ranks must be 0..1 (rank 0 is its leader node); got [1], missing [0]."),
    ("gms_node_rank out of the replicas' order", lambda: rank_also(0), "gms_node_rank",
     "is 0, but gms_replica 1 and gms_replica_rank 0 put node1 at place 1 of the deployment's nodes"),
    ("a replica number missing", lambda: fleet(2, 1, [(0, 0), (2, 0)]), "gms_replica",
     "numbers the replicas [0, 2]: replica(s) [1] have no node."),
    ("hosts with and without the variables", lambda: fleet(3, 1, [(0, 0), (1, 0)]), "gms_replica",
     "is set on node0 and node1, but not everywhere: node2 lacks gms_replica and gms_replica_rank."),
    ("gms_replica without gms_replica_rank", lambda: fleet(2, 1, [(0, None), (1, 0)]), "gms_replica",
     "node0 lacks gms_replica_rank"),
    ("a replica that is no number", lambda: fleet(2, 1, [("first", 0), (1, 0)]), "gms_replica",
     "must be a whole number, got the string 'first'"),
    ("a negative replica", lambda: fleet(2, 1, [(-1, 0), (0, 0)]), "gms_replica", "is -1, outside"),
    ("a negative rank", lambda: fleet(2, 2, [(0, 0), (0, -1)]), "gms_replica_rank", "is -1, outside"),
    ("a fractional rank", lambda: fleet(2, 2, [(0, 0), (0, 0.5)]), "gms_replica_rank", "must be a whole number"),
    ("gms_node_rank twice (today's rule)", lambda: rank_twice(), "gms_node_rank",
     "rank 0 is given to node0 and node1"),
]


@pytest.mark.parametrize(("case", "inventory", "field", "words"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_bad_fleet_is_refused_with_its_field_and_fix(case: str, inventory, field: str, words: str):
    hv, hosts = inventory()
    contract, problems = parse_contract(hv, hosts)
    assert contract is None, case
    matching = [p for p in problems if p.field == field and words in p.message]
    assert matching, [str(p) for p in problems]
    assert all(p.fix for p in problems)


def test_the_refusals_name_the_fix():
    (problem,) = parse_contract(*fleet(3, 2))[1]
    assert problem.fix == ("list 4 hosts in gms_nodes (2 replicas) or 2 (1), or set gms_engine.nnodes to 3 (or "
                           "leave it unset) for one replica of 3 nodes.")
    (problem,) = parse_contract(*fleet(3, 1, [(0, 0), (1, 0)]))[1]
    assert problem.fix.startswith("set gms_replica and gms_replica_rank on node2, or remove both from every node")
    (problem,) = parse_contract(*rank_also(0))[1]
    assert (problem.host, problem.fix) == ("node1", "remove gms_node_rank from node1 (gms_replica and "
                                                    "gms_replica_rank give the order), or set it to 1.")


def test_replicas_follow_gms_node_rank_nnodes_nodes_each():
    contract = parsed(*fleet(4, 2))
    assert [[(n.host, n.rank) for n in members] for members in contract.replicas] == [
        [("node0", 0), ("node1", 1)], [("node2", 0), ("node3", 1)]]
    with pytest.raises(ValueError, match="2 replicas, each with its own leader node"):
        contract.leader  # noqa: B018 (the property refuses)


def test_named_replicas_take_their_order_from_the_variables_not_the_inventory():
    """4 nodes as 4 replicas of one (nnodes left unset: the hosts of one replica), listed in any order."""
    hv, hosts = fleet(4, None, [(3, 0), (1, 0), (0, 0), (2, 0)])
    hv = {h: {**v, "gms_engine": {"tensor_parallel_size": 8, "gpus_per_node": 8}} for h, v in hv.items()}
    contract = parsed(hv, hosts)
    assert contract.engine.nnodes == 1
    assert [[n.host for n in members] for members in contract.replicas] == [["node2"], ["node1"], ["node3"], ["node0"]]
    assert {n.rank for n in contract.nodes} == {0}
    contract = parsed(*fleet(4, 2, [(1, 1), (1, 0), (0, 1), (0, 0)]))
    assert [[(n.host, n.rank) for n in members] for members in contract.replicas] == [
        [("node3", 0), ("node2", 1)], [("node1", 0), ("node0", 1)]]
    assert parsed(*rank_also(1)).replicas[1][0].host == "node1"  # gms_node_rank may agree


def fleet_plan(**shared: Any) -> Plan:
    return build_plan(parsed(*fleet(4, 2, **shared)))


def test_a_fleet_plan_has_a_replica_level_with_its_own_leader_master_and_lock():
    plan = fleet_plan()
    assert [(r.id, r.members, r.leader, r.master_address, r.master_port) for r in plan.replicas] == [
        (0, ("node0", "node1"), "node0", "198.18.0.10", 29500), (1, ("node2", "node3"), "node2", "198.18.0.12", 29500)]
    assert plan.fleet and plan.replica(1).lock_path == plan.lock_path  # the lock's path, on each leader node
    second = plan.replica(1)
    for cohort in second.cohorts:  # the same cohort numbers and ports as replica 0's, on its own hosts
        assert cohort.ports == plan.replica(0).cohort(cohort.cohort).ports
        assert [(r.host, r.node_rank, r.leader) for r in cohort.ranks] == [("node2", 0, True), ("node3", 1, False)]
        for rank in cohort.ranks:
            argv = rank.process.argv
            assert argv[argv.index("--master-addr") + 1] == "198.18.0.12"
            assert argv[argv.index("--nnodes") + 1] == "2"
            assert argv[argv.index("--node-rank") + 1] == str(rank.node_rank)
            assert rank.process.env["SHADOWLINE_NODE_RANK"] == str(rank.node_rank)


def test_the_whole_deployment_accessors_are_right_per_host_and_refuse_to_mean_replica_0():
    plan = fleet_plan()
    assert plan.hosts == ["node0", "node1", "node2", "node3"]
    assert [plan.node(h).rank for h in plan.hosts] == [0, 1, 0, 1]
    assert plan.replica_of("node3").id == 1 and plan.replica_of("node3").leader == "node2"
    assert plan.replica_of("node1").master_address == "198.18.0.10"
    assert plan.replica_of("node3").master_address == "198.18.0.12"
    assert plan.cohort(1).rank_on("node3").process.argv == plan.replica(1).cohort(1).ranks[1].process.argv
    assert [p.host for p in plan.gms_servers] == plan.hosts
    with pytest.raises(ValueError, match="2 replicas, each with its own leader node"):
        plan.leader_node  # noqa: B018
    with pytest.raises(ValueError, match="a leader in each of 2 replicas"):
        plan.cohort(0).leader  # noqa: B018
    with pytest.raises(KeyError, match="infra0 is not a node"):
        plan.replica_of("infra0")


def test_a_fleet_plan_round_trips_through_plan_json():
    plan = fleet_plan()
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["replicas"][1] == {"id": 1, "members": ["node2", "node3"], "leader": "node2",
                                   "master_address": "198.18.0.12", "master_port": 29500,
                                   "lock_path": plan.lock_path, "cohorts": [0, 1]}
    assert Plan.from_dict(data) == plan and Plan.from_dict(data).to_dict() == data


def test_one_replica_is_todays_plan_and_json_gains_only_the_replicas_key():
    """The plan.json of today's deployments: asdict of the plan as it was, plus ``replicas`` (one, by name); an
    older plan.json (no replicas) loads as that one replica."""
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16})
    plan = build_plan(parsed(hv, hosts))
    data = json.loads(json.dumps(plan.to_dict()))
    before = json.loads(json.dumps(dataclasses.asdict(plan)))  # what to_dict wrote before replicas
    before.pop("extra")
    before.pop("replicas")
    assert {k: v for k, v in data.items() if k != "replicas"} == before
    assert data["replicas"] == [{"id": 0, "members": ["node0", "node1"], "leader": "node0",
                                 "master_address": "198.18.0.10", "master_port": 29500, "lock_path": plan.lock_path,
                                 "cohorts": [0, 1]}]
    assert Plan.from_dict(before) == plan and Plan.from_dict(data) == plan
    (replica,) = plan.replicas
    assert replica.cohorts == plan.cohorts and not plan.fleet
    assert plan.leader_node.host == "node0" and plan.cohort(1).leader.host == "node0"


def test_ports_are_checked_on_every_replicas_leader():
    """A cohort's master port binds on each replica's leader node: on node2 (replica 1's leader, also the infra
    host here) it meets etcd's client port."""
    hv, hosts = fleet(4, 2, gms_ports={"master_base": 2379})
    problems = port_problems(parsed(hv, hosts, ["node2"]))
    assert any("port 2379 is used by both the etcd client and the cohort 0 master port on node2" in p.message
               for p in problems), [str(p) for p in problems]


def test_a_fleet_is_deployed_and_the_playbooks_of_one_replica_refuse_it_naming_the_fix():
    """site.yml deploys a fleet (preflight passes it); upgrade.yml upgrades one replica at a time: it refuses a fleet
    without a replica before anything changes, and never one replica or a fleet's named replica. drill.yml and
    failover.yml take a replica too (their own checks)."""
    fleet_plan_, one = fleet_plan(), build_plan(parsed(*fleet(2, 2)))
    for playbook in ("upgrade.yml",):
        refusal = fleet_refusal(fleet_plan_, playbook)
        assert refusal.startswith(f"replica: the deployment is a fleet of 2 replicas and {playbook} takes one"), refusal
        assert "Nothing was changed. Fix: run it for each replica in turn, -e replica=0 then -e replica=1" in refusal
        assert fleet_refusal(one, playbook) == "" and fleet_refusal(fleet_plan_, playbook, 1) == ""
        assert fleet_refusal(fleet_plan_, playbook, "0") == ""
    for playbook in ("site.yml", "drill.yml", "failover.yml", "teardown.yml", "status.yml", "pause.yml", "model.yml",
                     "monitoring.yml"):
        assert fleet_refusal(fleet_plan_, playbook) == ""
    assert "fleet_problems" not in dir(preflight)  # no refusal of a fleet left in preflight


def test_shadowline_plan_prints_a_fleet_replica_by_replica_and_one_replica_as_before():
    lines = plan_lines(fleet_plan().to_dict())
    assert lines[1].startswith("fleet: 2 replicas of 2 node(s), each driven by its own leader node's agent")
    assert "replica 1: node2, node3 (leader node2, master address 198.18.0.12)" in lines
    assert any(line.startswith("    node3 rank 1 (headless): ") for line in lines)
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16})
    one = plan_lines(build_plan(parsed(hv, hosts)).to_dict())
    assert not any(line.startswith(("fleet", "replica")) for line in one)
    assert one[2] == "cohort 0 (primary, ENGINE_ID=0) master 29500 system 8080 nixl 8280"
    assert one[3].startswith("  node0 rank 0 (leader): ")


def test_a_replicas_agents_drive_tell_and_hear_their_own_replica_only():
    """Plan.for_replica: what a replica's agents are given (control/agent.py): its nodes, its ranks of every
    cohort, its GMS servers, its lock and leader; the deployment's infra and settings; its number kept for the
    records' keys. Notices are taken from its own nodes only."""
    plan = fleet_plan(gms_insecure=True)
    own = plan.for_replica(1)
    assert own.hosts == ["node2", "node3"] and [n.rank for n in own.nodes] == [0, 1]
    assert own.leader_node.host == "node2" and own.cohort(0).leader.host == "node2"
    assert [r.host for c in own.cohorts for r in c.ranks] == ["node2", "node3", "node2", "node3"]
    assert [p.host for p in own.gms_servers] == ["node2", "node3"] and own.lock_path == plan.replica(1).lock_path
    assert [r.id for r in own.replicas] == [1] and own.replica(1) == plan.replica(1) and not own.fleet
    assert own.infra == plan.infra and own.deployment == plan.deployment and own.ports == plan.ports
    with pytest.raises(KeyError, match="node0 is not a node"):
        own.replica_of("node0")
    with pytest.raises(KeyError, match="has no replica 0"):
        own.replica(0)
    one = build_plan(parsed(*fleet(2, 2)))
    assert one.for_replica(0) is one
    assert sender_node(own, Peer(address="198.18.0.13", common_name="")) == "node3"
    assert sender_node(own, Peer(address="198.18.0.10", common_name="")) is None  # replica 0's node0
    assert sender_node(plan, Peer(address="198.18.0.10", common_name="")) == "node0"


def test_a_replicas_own_plan_round_trips_and_names_its_replica():
    """What drill.yml gives its modules (the replica_plan filter): one replica's plan, through its dict form."""
    plan = fleet_plan()
    own = plan.for_replica(1)
    back = Plan.from_dict(json.loads(json.dumps(own.to_dict())))
    assert back == own and sole_replica(back) == 1 and back.hosts == ["node2", "node3"]
    assert sole_replica(build_plan(parsed(*fleet(2, 2)))) == 0
    with pytest.raises(ValueError, match="is a fleet of 2 replicas: name one"):
        sole_replica(plan)
