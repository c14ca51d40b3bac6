"""The example inventories for real GPU clusters (inventories/examples/, issue #16) pass preflight's checks with
the facts a real node of their kind gives, and render their plan, every systemd unit and the Slurm job.

Read through ``ansible-inventory`` as Ansible reads them; nothing is contacted. The facts are what
node_facts.gather returns on such a node: 8 GPUs of an H100 80GB (81559 MiB), the runtime's interpreter finding
dynamo.vllm and gpu_memory_service, the lock directory on tmpfs, Debian 12."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shadowline.deployment import units
from shadowline.deployment.plan_builder import build_plan
from shadowline.deployment.preflight import run_preflight
from shadowline.slurm.render import ansible_inventory, deployment_values, read_with_ansible, render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "inventories" / "examples"
ANSIBLE_EXAMPLES = ["h100-2x8-tp16", "one-node-tp8", "three-infra"]
# fleets (docs/fleet.md): pass preflight and render, replica by replica
FLEET_EXAMPLES = ["fleet-2x2-tp16", "fleet-4x8-tp8"]
H100_MIB = 81559.0


def read(name: str) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    tool = ansible_inventory()
    assert tool, "ansible-inventory is part of the dev venv (make setup)"
    return read_with_ansible(tool, str(EXAMPLES / name))


def node_facts(gpus: int = 8, mib: float = H100_MIB) -> dict[str, Any]:
    return {
        "listening": [], "processes": [],
        "gpus": [{"uuid": f"GPU-{i:08x}-1111-2222-3333-444455556666", "memory_mib": mib} for i in range(gpus)],
        "python": {"exists": True, "modules": {"dynamo.vllm": True, "vllm": True, "gpu_memory_service": True}},
        "lock_dir": {"path": "/run/shadowline", "exists": False, "existing_ancestor": "/run", "ancestor_is_dir": True,
                     "fstype": "tmpfs", "mountpoint": "/run", "read_only": False},
        "manifest_weight_bytes": None,
        "platform": {"id": "debian", "version_id": "12", "pretty_name": "Debian GNU/Linux 12 (bookworm)",
                     "python": [3, 11, 2]},
    }


GPU_WHEELS = ["ai-dynamo", "ai-dynamo-runtime", "gpu-memory-service", "nixl", "torch", "vllm"]


def preflight(name: str, facts: dict[str, Any] | None = None, wheels: list[str] | None = None):
    """Preflight with a real node's facts; the runtime's as the inventory delivers it (python_env_mode)."""
    hostvars, groups = read(name)
    nodes, infra = groups.get("gms_nodes", []), groups.get("gms_infra", [])
    facts = dict(facts or node_facts())
    mode = hostvars[nodes[0]].get("python_env_mode", "venv")
    facts["runtime_mode"] = mode
    if mode == "wheelhouse":
        facts["wheelhouse"] = {"path": hostvars[nodes[0]]["python_env_wheelhouse"], "exists": True,
                               "projects": GPU_WHEELS if wheels is None else wheels}
    infra_facts = {**node_facts(), "gpus": None, "python": None}
    facts_by_host = {h: facts for h in nodes} | {h: infra_facts for h in infra if h not in nodes}
    return run_preflight(hostvars, nodes, infra, facts_by_host)


def test_every_example_is_tested():
    assert sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir()) == sorted(ANSIBLE_EXAMPLES + FLEET_EXAMPLES +
                                                                             ["slurm-pyxis"])


@pytest.mark.parametrize("name", ANSIBLE_EXAMPLES)
def test_example_passes_preflight_and_renders_every_unit(name: str):
    result = preflight(name)
    assert result.problems == [] and result.plan is not None, result.problems
    plan = result.plan
    assert plan.engine.name == "dynamo_vllm"
    for process in plan.gms_servers:  # the GMS server and every rank of a node see the same GPUs, in bus order
        assert process.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert process.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
        assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in units.gms_unit(plan, process.host)
    rendered = [units.frontend_unit(plan), units.engine_template(plan)]
    rendered += [units.etcd_unit(plan, n.host) for n in plan.infra.hosts]
    rendered += [units.nats_unit(plan, n.host) for n in plan.infra.hosts]
    for node in plan.nodes:
        rendered.append(units.agent_unit(plan, node.host))
        for cohort in plan.cohorts:
            rank = cohort.rank_on(node.host)
            dropin = units.engine_dropin(plan, node.host, cohort.cohort)
            assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in dropin and "TORCH_NCCL_ASYNC_ERROR_HANDLING=3" in dropin
            assert ("--headless" in rank.process.argv) == (node.rank != 0)
            assert rank.process.argv[1:3] == ("-m", "dynamo.vllm")
            rendered.append(dropin)
    assert all(text.strip() for text in rendered)


def test_the_shapes_are_the_ones_the_examples_promise():
    two = preflight("h100-2x8-tp16").plan
    assert (len(two.nodes), len(two.cohorts), two.infra.hosts[0].host) == (2, 2, "infra01")
    assert "16" == two.cohort(0).ranks[0].process.argv[two.cohort(0).ranks[0].process.argv.index("--tensor-parallel-size") + 1]
    one = preflight("one-node-tp8").plan
    assert (len(one.nodes), [c.role for c in one.cohorts]) == (1, ["primary", "shadow", "shadow"])
    # container mode: NVIDIA's image, every GPU through CDI, the plan's argv after the image's name
    dropin = units.engine_dropin(one, "gpu01", 2)
    assert " --device nvidia.com/gpu=all " in dropin
    assert " nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1 python3 -m dynamo.vllm --model " in dropin
    three = preflight("three-infra").plan
    assert [h.host for h in three.infra.hosts] == ["infra01", "infra02", "infra03"]
    assert three.infra.etcd_endpoints.count("https://") == 3


@pytest.mark.parametrize(("name", "replicas"), [("fleet-2x2-tp16", [["gpu01", "gpu02"], ["gpu03", "gpu04"]]),
                                               ("fleet-4x8-tp8", [["gpu01"], ["gpu02"], ["gpu03"], ["gpu04"]])])
def test_a_fleet_example_passes_preflight_and_renders(name: str, replicas: list[list[str]]):
    """A fleet passes preflight on its nodes' facts; its plan (replica by replica) and every unit of every node
    render."""
    result = preflight(name)
    assert result.problems == [], [str(p) for p in result.problems]
    assert result.contract is not None and result.plan is not None
    plan = build_plan(result.contract)
    assert [list(r.members) for r in plan.replicas] == replicas
    for replica in plan.replicas:
        leader = plan.node(replica.leader)
        for cohort in replica.cohorts:
            for rank in cohort.ranks:
                argv = rank.process.argv
                assert argv[argv.index("--tensor-parallel-size") + 1] == str(8 * len(replica.members))
                assert ("--headless" in argv) == (rank.node_rank != 0) and rank.host in replica.members
                if len(replica.members) > 1:
                    assert argv[argv.index("--master-addr") + 1] == leader.address
                assert "TORCH_NCCL_ASYNC_ERROR_HANDLING=3" in units.engine_dropin(plan, rank.host, cohort.cohort)
        assert all(units.agent_unit(plan, host) and units.gms_unit(plan, host) for host in replica.members)


def test_the_memory_budget_refuses_the_example_on_smaller_gpus():
    """The same inventory on 8 A100 40GB: weights / 8 + KV + 3 engines do not fit, and preflight says so."""
    (problem,) = preflight("one-node-tp8", node_facts(mib=40960.0)).problems
    assert problem.field == "gms_memory" and "has 40.0 GiB" in problem.message


def test_the_slurm_example_renders_a_job_in_nvidias_container():
    hostvars, groups = read("slurm-pyxis")
    shared, hosts, problems = deployment_values(hostvars, groups, "gms_nodes")
    assert problems == []
    text, name, problems = render(shared, hosts, "test")
    assert problems == [] and text is not None and name == "shadowline-llama70b.sbatch"
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=8" in text
    assert "--container-image='nvcr.io#nvidia/ai-dynamo/vllm-runtime:1.6.1'" in text
    assert "--container-name=shadowline-llama70b" in text and "--no-container-mount-home" in text
    # what the image holds (Dynamo's vllm_runtime recipe) and what it does not: shadowline, from library_dir
    assert "        /usr/local/bin/etcd/etcd \\\n" in text and "        /usr/bin/nats-server -c " in text
    library = "/shared/ansible/ansible_collections/shadowline/gms/plugins/module_utils"
    assert f"PYTHONPATH={library}\n" in text and f",{library}:{library}:ro " in text


@pytest.mark.parametrize("name", ["h100-2x8-tp16"])
def test_shadowline_plan_prints_the_example(name: str):
    """`shadowline plan` (Ansible's cohort_plan module, templating included) on an example, as a user runs it."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "show-plan"), str(EXAMPLES / name)],
                          capture_output=True, text=True, check=False, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "gpu02 rank 1 (headless)" in proc.stdout and "--tensor-parallel-size 16" in proc.stdout


def test_shadowline_plan_prints_a_fleet_example_replica_by_replica():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "show-plan"), str(EXAMPLES / "fleet-2x2-tp16")],
                          capture_output=True, text=True, check=False, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "replica 1: gpu03, gpu04 (leader gpu03, master address 10.10.0.13)" in proc.stdout
    assert "    gpu04 rank 1 (headless): " in proc.stdout and "--master-addr 10.10.0.13" in proc.stdout


def test_a_wheelhouse_without_gms_is_named_before_anything_changes():
    problems = preflight("h100-2x8-tp16", wheels=["ai-dynamo", "ai-dynamo-runtime", "torch", "vllm"]).problems
    assert [(p.field, p.host) for p in problems] == [("python_env_wheelhouse", "gpu01"), ("python_env_wheelhouse", "gpu02")]
    assert problems[0].message == "/srv/wheelhouse/dynamo-1.6.1 has no wheel of gpu-memory-service."
