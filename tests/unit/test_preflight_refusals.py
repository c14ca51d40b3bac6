"""What the plan and preflight refuse before anything changes on any host (issue #42, Preflight), each naming the
field and the fix: an empty or misspelt gms_nodes, two hosts with one address, a model source with whitespace or
that reads as an option, two processes of one host on one port (checked by the plan builder, so every path to a
plan refuses them), and the warning that one cohort cannot fail over."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shadowline.deployment.contract import missing_group_problem, parse_contract
from shadowline.deployment.plan_builder import PlanRefused, build_plan, checked_plan
from shadowline.deployment.ports import port_problems
from shadowline.deployment.preflight import run_preflight
from shadowline.model.errors import SpecError
from shadowline.model.spec import parse_source
from shadowline.slurm.job import build_job_plan

from .helpers import REVISION, hostvars

ROOT = Path(__file__).resolve().parents[2]


def problems_of(hv: dict, hosts: list[str], infra: list[str] | None = None) -> list[str]:
    contract, problems = parse_contract(hv, hosts, infra or [])
    if contract is not None:
        problems = checked_plan(contract)[1]
    return [str(p) for p in problems]


# -- gms_nodes empty, missing or misspelt --------------------------------------------------------------------- #

GROUP_MESSAGE = ("gms_nodes: the group is empty or missing from the inventory, so no play would run on any node "
                 "(Ansible skips a play whose hosts match nothing, and the run would look green).")
ADD_FIX = ("add a group gms_nodes with one host per GPU node, each with gms_node_rank (an example: "
           "inventories/local/hosts.yml).")


@pytest.mark.parametrize(("groups", "wanted"), [
    (None, f"{GROUP_MESSAGE} Fix: {ADD_FIX}"),
    ({"all": [], "ungrouped": []}, f"{GROUP_MESSAGE} The inventory has no other group. Fix: {ADD_FIX}"),
    ({"all": [], "ungrouped": [], "gms_nodes": []}, f"{GROUP_MESSAGE} The inventory has no other group. Fix: {ADD_FIX}"),
    ({"all": ["a", "b"], "ungrouped": [], "gms_node": ["a", "b"], "gms_infra": []},
     f"{GROUP_MESSAGE} The inventory's groups: gms_infra (0 hosts), gms_node (2 hosts). Fix: did you mean "
     f"gms_node? Rename that group to gms_nodes, or {ADD_FIX}"),
    ({"all": ["a"], "ungrouped": [], "gpu_nodes": ["a"]},
     f"{GROUP_MESSAGE} The inventory's groups: gpu_nodes (1 host). Fix: did you mean gpu_nodes? Rename that group "
     f"to gms_nodes, or {ADD_FIX}"),
    ({"all": ["a"], "ungrouped": ["a"], "webservers": []},
     f"{GROUP_MESSAGE} The inventory's groups: webservers (0 hosts). Hosts in no group: a. Fix: {ADD_FIX}"),
])
def test_an_empty_or_misspelt_node_group_is_refused_naming_the_groups_there_are(groups, wanted):
    assert str(missing_group_problem("gms_nodes", groups)) == wanted


def test_the_contract_refuses_no_nodes_with_the_same_message():
    assert problems_of({}, []) == [f"{GROUP_MESSAGE} Fix: {ADD_FIX}"]


@pytest.fixture(scope="module")
def group_problem():
    """plugins/filter/inventory.py as playbooks/preflight.yml's first play loads it (through collections/)."""
    sys.path.insert(0, str(ROOT / "collections"))
    try:
        module = pytest.importorskip("ansible_collections.shadowline.gms.plugins.filter.inventory")
    finally:
        sys.path.remove(str(ROOT / "collections"))
    return module.FilterModule().filters()["group_problem"]


def test_preflights_first_play_refuses_with_the_contracts_problem(group_problem):
    assert group_problem({"all": ["n0"], "ungrouped": [], "gms_nodes": ["n0"]}) == ""
    text = group_problem({"all": ["n0"], "ungrouped": [], "gms_node": ["n0"]})
    assert text.startswith("preflight found 1 problem; nothing was changed on any host:\n  1. gms_nodes: ")
    assert "did you mean gms_node? Rename that group to gms_nodes" in text


def test_the_playbook_checks_the_group_before_any_host_is_reached():
    text = (ROOT / "playbooks" / "preflight.yml").read_text()
    first = text.split("\n- name: ", 2)[1]
    assert first.startswith("Preflight | the inventory has the deployment's nodes")
    assert "else 'localhost'" in first and "shadowline.gms.group_problem('gms_nodes')" in first


def test_slurm_render_names_the_groups_too():
    from shadowline.slurm.render import deployment_values

    _shared, count, problems = deployment_values({}, {"all": ["x"], "ungrouped": [], "gms_nodez": ["x"]}, "gms_nodes")
    assert count == 0
    (problem,) = problems
    assert problem.field == "gms_nodes" and "gms_nodez (1 host)" in problem.message
    assert problem.fix.startswith("did you mean gms_nodez? Rename that group to gms_nodes, or add a group gms_nodes "
                                  "with at least one host; under Slurm")


# -- two hosts with one address ------------------------------------------------------------------------------- #

def _with(hv: dict, **per_host: dict) -> dict:
    return {host: {**values, **per_host.get(host, {})} for host, values in hv.items()}


NODE_FIX_TAIL = "one machine cannot be two nodes."


@pytest.mark.parametrize(("per_host", "wanted"), [
    ({"node1": {"ansible_host": "198.18.0.10"}},
     "ansible_host (host node1): node0 and node1 of gms_nodes have the same address 198.18.0.10 (both from "
     "ansible_host); every node needs its own: it is the master address, the address the node's engines and agent "
     "bind and the one etcd and NATS are given. Fix: set ansible_host of node1 to that node's own IP address or "
     f"host name; {NODE_FIX_TAIL}"),
    ({"node1": {"gms_node_address": "198.18.0.10"}},
     "gms_node_address (host node1): node0 and node1 of gms_nodes have the same address 198.18.0.10 (node0's from "
     "ansible_host, node1's from gms_node_address); every node needs its own: it is the master address, the address "
     "the node's engines and agent bind and the one etcd and NATS are given. Fix: set gms_node_address of node1 to "
     f"that node's own IP address or host name; {NODE_FIX_TAIL}"),
    ({"node0": {"gms_node_address": "fd00::5"}, "node1": {"gms_node_address": "fd00:0:0::05"}},
     "gms_node_address (host node1): node0 and node1 of gms_nodes have the same address fd00:0:0::05 (both from "
     "gms_node_address); every node needs its own: it is the master address, the address the node's engines and "
     "agent bind and the one etcd and NATS are given. Fix: set gms_node_address of node1 to that node's own IP "
     f"address or host name; {NODE_FIX_TAIL}"),
    ({"node0": {"ansible_host": "GPU-01.cluster"}, "node1": {"ansible_host": "gpu-01.cluster."}},
     "ansible_host (host node1): node0 and node1 of gms_nodes have the same address gpu-01.cluster. (both from "
     "ansible_host); every node needs its own: it is the master address, the address the node's engines and agent "
     "bind and the one etcd and NATS are given. Fix: set ansible_host of node1 to that node's own IP address or "
     f"host name; {NODE_FIX_TAIL}"),
])
def test_two_nodes_with_one_address_are_refused_naming_both_and_the_field(per_host, wanted):
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16})
    assert problems_of(_with(hv, **per_host), hosts) == [wanted]


def test_each_pair_is_named_once_and_three_nodes_on_one_address_give_two():
    hv, hosts = hostvars(3, gms_engine={"tensor_parallel_size": 24})
    found = problems_of(_with(hv, node1={"ansible_host": "198.18.0.10"}, node2={"ansible_host": "198.18.0.10"}), hosts)
    assert [p.split(":", 1)[0] for p in found] == ["ansible_host (host node1)", "ansible_host (host node2)"]
    assert "node0 and node2 of gms_nodes" in found[1]


@pytest.mark.parametrize(("infra", "wanted"), [
    ({"infra0": {"ansible_host": "198.18.0.11"}},
     "ansible_host (host infra0): infra0 of gms_infra has the address 198.18.0.11 of the node node1 (both from "
     "ansible_host): one machine under two inventory names, whose etcd, NATS and etcd proxy would be planned twice. "
     "Fix: list node1 itself in gms_infra (the same inventory name), or set ansible_host of infra0 to its own "
     "address."),
    ({"infra0": {"ansible_host": "198.18.0.50"}, "infra1": {"ansible_host": "198.18.0.51"},
      "infra2": {"gms_node_address": "198.18.0.50"}},
     "gms_node_address (host infra2): infra0 and infra2 of gms_infra have the same address 198.18.0.50 (infra0's "
     "from ansible_host, infra2's from gms_node_address); etcd's and NATS's members each need their own. Fix: set "
     "gms_node_address of infra2 to its own IP address or host name."),
])
def test_infra_hosts_with_a_taken_address_are_refused(infra, wanted):
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16})
    hv = {**hv, **infra}
    assert problems_of(hv, hosts, list(infra)) == [wanted]


def test_a_node_listed_in_gms_infra_by_its_own_name_is_no_duplicate():
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16})
    assert problems_of(hv, hosts, ["node0"]) == []


# -- model sources -------------------------------------------------------------------------------------------- #

WHITESPACE_FIX = ("write the source as one word, without spaces, tabs or newlines anywhere (rename a source "
                  "directory whose name has one).")
OPTION_FIX = ("write a URI: hf://<repo>, file:///<absolute path>, rsync://<host>/<path> or "
              "rsync+ssh://[user@]<host>/<absolute path>.")


@pytest.mark.parametrize(("source", "wanted"), [
    ("hf://org/my model", f"'hf://org/my model' has whitespace or a control character. Fix: {WHITESPACE_FIX}"),
    (" hf://org/model", f"' hf://org/model' has whitespace or a control character. Fix: {WHITESPACE_FIX}"),
    ("hf://org/model\n", f"'hf://org/model\\n' has whitespace or a control character. Fix: {WHITESPACE_FIX}"),
    ("file:///srv/models/my\tmodel",
     f"'file:///srv/models/my\\tmodel' has whitespace or a control character. Fix: {WHITESPACE_FIX}"),
    ("rsync://head-0/models/llama\u00a0v2",
     f"'rsync://head-0/models/llama\\xa0v2' has whitespace or a control character. Fix: {WHITESPACE_FIX}"),
    ("file:///srv/models/my%20model",
     f"'file:///srv/models/my%20model' has whitespace or a control character in its path. Fix: {WHITESPACE_FIX}"),
    ("rsync+ssh://svc@head-0/srv/a%0Ab",
     f"'rsync+ssh://svc@head-0/srv/a%0Ab' has whitespace or a control character in its path. Fix: {WHITESPACE_FIX}"),
    ("-e", f"'-e' starts with '-', so a command would read it as an option. Fix: {OPTION_FIX}"),
    ("--rsh=sh://x", f"'--rsh=sh://x' starts with '-', so a command would read it as an option. Fix: {OPTION_FIX}"),
])
def test_a_source_with_whitespace_or_that_reads_as_an_option_is_refused(source, wanted):
    hv, hosts = hostvars(1, gms_model={"source": source})
    assert problems_of(hv, hosts) == [f"gms_model.source: {wanted}"]


@pytest.mark.parametrize("source", ["hf://org/my model", "-e", "file:///srv/a%20b"])
def test_the_staging_side_refuses_the_same_sources(source):
    """The model module on the nodes parses sources with the same function (one parser for both)."""
    with pytest.raises(SpecError) as err:
        parse_source(source, "org/model")
    assert err.value.field == "gms_model.source" and err.value.fix


@pytest.mark.parametrize("source", ["hf://org/model", "file:///srv/models/llama-3", "rsync://head-0:8873/m/p",
                                    "rsync+ssh://svc@head-0/srv/m/p-1"])
def test_plain_sources_pass(source):
    hv, hosts = hostvars(1, gms_model={"source": source})
    assert problems_of(hv, hosts) == []


# -- ports, where they are bound ------------------------------------------------------------------------------ #

PORT_FIX = "so no two processes of a host share a port (each cohort takes one master, one system and one NIXL port)."


def _infra(count: int) -> dict:
    return {f"infra{i}": {"ansible_host": f"198.18.0.{50 + i}"} for i in range(count)}


@pytest.mark.parametrize(("nodes", "infra", "ports", "wanted"), [
    # the leader node is the infra host (gms_infra empty): the frontend shares it with cohort 0's system port
    (1, 0, {"frontend": 8080},
     [f"gms_ports.system_base: port 8080 is used by both the frontend and the cohort 0 system port on node0. "
      f"Fix: move gms_ports.system_base or gms_ports.frontend {PORT_FIX}"]),
    # the same numbers with the frontend on a host of its own: no collision
    (1, 1, {"frontend": 8080}, []),
    # a NIXL port on the agent's metrics port, on every node
    (3, 0, {"nixl_base": 8479},
     [f"gms_ports.nixl_base: port 8480 is used by both the agent metrics and the cohort 1 NIXL side channel on "
      f"node0, node1 and node2. Fix: move gms_ports.nixl_base or gms_ports.agent_metrics {PORT_FIX}"]),
    # more nodes than the message lists
    (5, 1, {"nixl_base": 8479},
     [f"gms_ports.nixl_base: port 8480 is used by both the agent metrics and the cohort 1 NIXL side channel on "
      f"node0, node1, node2 and 2 more. Fix: move gms_ports.nixl_base or gms_ports.agent_metrics {PORT_FIX}"]),
    # a master port (the leader's only) on etcd's client port: the leader node is the infra host
    (2, 0, {"master_base": 2279},
     [f"gms_ports.master_base/master_stride: port 2379 is used by both the etcd client and the cohort 1 master "
      f"port on node0. Fix: move gms_ports.master_base/master_stride or gms_ports.etcd_client {PORT_FIX}"]),
    (2, 1, {"master_base": 2279}, []),
    # a master port on another cohort's system port: the leader node alone binds master ports
    (2, 1, {"master_base": 8082, "master_stride": 1000},
     [f"gms_ports.system_base: port 8082 is used by both the cohort 0 master port and the cohort 2 system port on "
      f"node0. Fix: move gms_ports.system_base or gms_ports.master_base/master_stride {PORT_FIX}"]),
    # NATS's cluster routes exist with three infra hosts only
    (1, 0, {"nats_cluster": 8081}, []),
    (3, 3, {"nats_cluster": 8281}, []),  # infra hosts of their own: the nodes' NIXL ports are elsewhere
    # the etcd proxy is on every host, the infra hosts' too
    (1, 1, {"etcd_proxy": 2377},
     [f"gms_ports.etcd_proxy: port 2379 is used by both the etcd client and the etcd proxy to member 3 (loopback) on "
      f"infra0. Fix: move gms_ports.etcd_proxy or gms_ports.etcd_client {PORT_FIX}"]),
    # a port beyond 65535 is refused once, not per host
    (2, 0, {"master_base": 65400},
     ["gms_ports.master_base/master_stride: gives the cohort 2 master port port 65600, outside 1024..65535. Fix: "
      "lower gms_ports.master_base/master_stride (or gms_cohorts) so every port stays in 1024..65535."]),
])
def test_ports_collide_only_on_a_host_that_binds_both(nodes, infra, ports, wanted):
    hv, hosts = hostvars(nodes, gms_cohorts=3, gms_ports=ports, gms_engine={"tensor_parallel_size": 8 * nodes})
    hv = {**hv, **_infra(infra)}
    assert problems_of(hv, hosts, list(_infra(infra))) == wanted


def test_nats_cluster_routes_collide_where_three_nodes_are_the_infra_hosts():
    hv, hosts = hostvars(3, gms_cohorts=2, gms_ports={"nats_cluster": 8281}, gms_engine={"tensor_parallel_size": 24})
    assert problems_of(hv, hosts, hosts) == [
        f"gms_ports.nixl_base: port 8281 is used by both the NATS cluster routes and the cohort 1 NIXL side channel on "
        f"node0, node1 and node2. Fix: move gms_ports.nixl_base or gms_ports.nats_cluster {PORT_FIX}"]


def _colliding_contract():
    hv, hosts = hostvars(1, gms_ports={"frontend": 8081})
    contract, problems = parse_contract(hv, hosts)
    assert contract is not None and problems == []
    return contract


COLLISION = ("gms_ports.system_base: port 8081 is used by both the frontend and the cohort 1 system port on node0. "
             f"Fix: move gms_ports.system_base or gms_ports.frontend {PORT_FIX}")


def test_the_plan_builder_refuses_a_collision_on_every_path():
    contract = _colliding_contract()
    assert [str(p) for p in port_problems(contract)] == [COLLISION]
    with pytest.raises(PlanRefused) as refused:
        build_plan(contract)
    assert str(refused.value) == f"the cohort plan found 1 problem; nothing was changed on any host:\n  1. {COLLISION}"
    plan, problems = checked_plan(contract)
    assert plan is None and [str(p) for p in problems] == [COLLISION]


def test_preflight_reports_the_plans_refusal():
    hv, hosts = hostvars(1, gms_ports={"frontend": 8081})
    outcome = run_preflight(hv, hosts, [], {h: None for h in hosts})
    assert outcome.plan is None
    assert COLLISION in [str(p) for p in outcome.problems]


def test_slurm_render_refuses_the_same_collision():
    shared = {"gms_deployment": "llama", "gms_model": {"id": "org/model", "revision": REVISION},
              "gms_engine": {"backend": "dynamo_vllm", "tensor_parallel_size": 1}, "gms_ports": {"frontend": 8081}}
    plan, options, problems = build_job_plan(shared, 1)
    assert plan is None and options is None
    assert [str(p) for p in problems] == [COLLISION.replace("on node0", "on slurm-node-0")]


# -- one cohort: a warning, not a refusal --------------------------------------------------------------------- #

def _facts() -> dict:
    modules = {"dynamo.vllm": True, "vllm": True, "gpu_memory_service": True}
    return {"listening": [], "gpus": None, "python": {"exists": True, "modules": modules},
            "lock_dir": {"path": "/run/x", "exists": False, "existing_ancestor": "/run", "ancestor_is_dir": True,
                         "fstype": "tmpfs", "mountpoint": "/run", "read_only": False}, "manifest_weight_bytes": None}


@pytest.mark.parametrize(("cohorts", "warned"), [(1, True), ("1", True), (2, False), (3, False)])
def test_one_cohort_is_warned_of_not_refused(cohorts, warned):
    hv, hosts = hostvars(1, gms_cohorts=cohorts)
    outcome = run_preflight(hv, hosts, [], {h: _facts() for h in hosts})
    assert outcome.problems == [] and outcome.plan is not None
    assert [w.startswith("gms_cohorts is 1: deployment llama has a primary cohort and no shadow, so nothing can "
                         "take over when it fails") for w in outcome.warnings] == ([True] if warned else [])


def test_the_insecure_warning_is_still_given():
    hv, hosts = hostvars(1, gms_insecure=True)
    outcome = run_preflight(hv, hosts, [], {h: _facts() for h in hosts})
    assert outcome.problems == [] and len(outcome.warnings) == 1
    assert outcome.warnings[0].startswith("gms_insecure is true")
