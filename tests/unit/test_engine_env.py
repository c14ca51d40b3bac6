"""gms_engine.env (the engines' environment a site needs: NCCL's and Gloo's NIC names) and gms_engine.cuda_graphs
(whether --enforce-eager is rendered): parsed and refused with the field named, rendered into every rank's unit,
the cohort's configuration digest and the Slurm job, never over a variable the plan sets (issue #42)."""

from __future__ import annotations

import pytest

from shadowline.deployment import units
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan_builder import PlanRefused, build_plan
from shadowline.slurm.job import build_job_plan

from .helpers import hostvars
from .test_plan import plan_for

NICS = {"NCCL_SOCKET_IFNAME": "ens1f0", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "GLOO_SOCKET_IFNAME": "ens1f0",
        "NCCL_IB_GID_INDEX": 3}


def problems_of(engine: dict) -> list[str]:
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 2, **engine})
    _contract, problems = parse_contract(hv, hosts)
    return [str(p) for p in problems]


def test_the_environment_reaches_every_ranks_unit_as_strings():
    plan = plan_for(2, gms_engine={"tensor_parallel_size": 2, "env": NICS})
    for cohort in plan.cohorts:
        for rank in cohort.ranks:
            assert {k: rank.process.env[k] for k in NICS} == {k: str(v) for k, v in NICS.items()}
            dropin = units.engine_dropin(plan, rank.host, cohort.cohort)
            assert 'Environment="NCCL_IB_HCA=mlx5_0,mlx5_1"' in dropin
            assert 'Environment="NCCL_IB_GID_INDEX=3"' in dropin


def test_the_environment_is_part_of_the_cohorts_configuration():
    """An upgrade that changes only gms_engine.env restarts the cohort whole, like one that changes its flags."""
    plain = plan_for(2, gms_engine={"tensor_parallel_size": 2})
    nics = plan_for(2, gms_engine={"tensor_parallel_size": 2, "env": NICS})
    assert units.cohort_config(plain, 0) != units.cohort_config(nics, 0)


def test_the_slurm_job_carries_it_too():
    shared = {"gms_deployment": "llama", "gms_engine": {"backend": "standin", "tensor_parallel_size": 2, "nnodes": 2,
                                                        "env": {"NCCL_SOCKET_IFNAME": "ib0"}},
              "gms_model": {"id": "org/m", "revision": "0123456789abcdef0123456789abcdef01234567",
                            "local_dir": "/scratch/models/m"}, "gms_slurm": {"model_check": False}}
    plan, _options, problems = build_job_plan(shared, 2)
    assert problems == [] and plan is not None
    assert all(r.process.env["NCCL_SOCKET_IFNAME"] == "ib0" for c in plan.cohorts for r in c.ranks)


@pytest.mark.parametrize(("env", "expected"), [
    ({"NCCL SOCKET": "x"}, "gms_engine.env: has the name 'NCCL SOCKET', which is no environment variable name."),
    ({"9LIVES": "x"}, "which is no environment variable name"),
    ({"SHADOWLINE_COHORT": "3"}, "gms_engine.env.SHADOWLINE_COHORT: is set by shadowline itself"),
    ({"HOME": "/root"}, "gms_engine.env.HOME: is set by shadowline itself"),
    ({"HF_TOKEN": "hf_abc"}, "gms_engine.env.HF_TOKEN: looks like a secret"),
    ({"WANDB_API_KEY": "k"}, "gms_engine.env.WANDB_API_KEY: looks like a secret"),
    ({"AWS_SECRET_ACCESS_KEY": "k"}, "looks like a secret"),
    ({"NCCL_DEBUG": True}, "gms_engine.env.NCCL_DEBUG: must be a string or a number, got the boolean true."),
    ({"NCCL_DEBUG": ["INFO"]}, "gms_engine.env.NCCL_DEBUG: must be a string or a number, got list."),
    ({"NCCL_DEBUG": "INFO\nExecStartPre=/bin/sh"}, "gms_engine.env.NCCL_DEBUG: has a control character"),
    ("NCCL_DEBUG=INFO", "gms_engine.env: must be a mapping of variable names to values, got the string"),
    ({"NCCL_DEBUG": "x" * 5000}, "more than 4096 characters"),
])
def test_a_bad_environment_is_refused_naming_the_variable(env, expected):
    problems = problems_of({"env": env})
    assert len(problems) == 1 and expected in problems[0], problems


def test_a_refused_value_is_never_repeated_in_the_message():
    (problem,) = problems_of({"env": {"HF_TOKEN": "hf_very_secret_value"}})
    assert "hf_very_secret_value" not in problem


@pytest.mark.parametrize("name", ["ENGINE_ID", "FAILOVER_LOCK_PATH", "ETCD_ENDPOINTS", "DYN_SYSTEM_PORT",
                                  "GMS_SOCKET_DIR", "VLLM_NIXL_SIDE_CHANNEL_PORT"])
def test_a_variable_the_plan_sets_is_refused_where_the_plan_is_built(name):
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 2, "env": {name: "mine"}})
    contract, problems = parse_contract(hv, hosts)
    assert problems == [] and contract is not None
    with pytest.raises(PlanRefused) as refused:
        build_plan(contract)
    assert [p.field for p in refused.value.problems] == [f"gms_engine.env.{name}"]
    assert "mine" not in str(refused.value)


def test_eager_by_default_cuda_graphs_on_request_and_never_through_extra_args():
    eager = plan_for(2, gms_engine={"tensor_parallel_size": 2})
    graphs = plan_for(2, gms_engine={"tensor_parallel_size": 2, "cuda_graphs": True})
    for rank in eager.cohort(0).ranks:
        assert "--enforce-eager" in rank.process.argv
    for rank in graphs.cohort(0).ranks:
        assert "--enforce-eager" not in rank.process.argv
    assert units.cohort_config(eager, 0) != units.cohort_config(graphs, 0)
    (problem,) = problems_of({"extra_args": ["--enforce-eager"]})
    assert "gms_engine.extra_args: contains --enforce-eager" in problem and "gms_engine.cuda_graphs" in problem
    (problem,) = problems_of({"cuda_graphs": "sometimes"})
    assert problem.startswith("gms_engine.cuda_graphs: must be true or false")
