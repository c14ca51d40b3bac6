"""Detection settings of issue #14: gms_failover's progress_stall_s, canary_interval_s and collective_timeout_s
(parsed and bounded), and the watchdog environment and flag the plan renders from collective_timeout_s; the
backends' switches the agent reads (progress metrics path, the stand-in's heartbeat file)."""

from __future__ import annotations

import dataclasses

import pytest

from shadowline.backends import backend, dynamo_vllm
from shadowline.common.settings import DEFAULT_FAILOVER, Failover
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.engine_contract import MANAGED_FLAGS
from shadowline.deployment.plan import Plan
from shadowline.deployment.plan_builder import build_plan

from .helpers import hostvars

WATCHDOG_ENV = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
                "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC")


def contract_of(nodes: int = 1, **shared):
    hv, hosts = hostvars(nodes, **shared)
    contract, problems = parse_contract(hv, hosts)
    return contract, [str(p) for p in problems]


def test_defaults_for_real_engines():
    contract, problems = contract_of()
    assert problems == []
    failover = contract.failover
    assert (failover.progress_stall_s, failover.canary_interval_s, failover.collective_timeout_s) == (60.0, 5.0, 600)
    assert "heartbeat_stall_s" not in DEFAULT_FAILOVER


def test_the_heartbeat_setting_is_gone_with_a_fix():
    _unused, problems = contract_of(gms_failover={"heartbeat_stall_s": 3})
    assert len(problems) == 1 and "gms_failover.heartbeat_stall_s" in problems[0]
    assert "is no longer a setting" in problems[0] and "progress_stall_s" in problems[0]


def test_drill_settings_parse():
    contract, problems = contract_of(gms_failover={"progress_stall_s": "1.5", "canary_interval_s": 0.5,
                                                   "collective_timeout_s": 2})
    assert problems == []
    assert (contract.failover.progress_stall_s, contract.failover.canary_interval_s) == (1.5, 0.5)
    assert contract.failover.collective_timeout_s == 2


@pytest.mark.parametrize("key, value, wanted", [
    ("progress_stall_s", float("nan"), "must be a number"),  # nan would never compare: no stall ever
    ("progress_stall_s", float("inf"), "must be a number"),
    ("progress_stall_s", 0, "must be above 0"),
    ("progress_stall_s", 7200, "at most 3600"),
    ("canary_interval_s", -1, "must be above 0"),
    ("canary_interval_s", "often", "must be a number"),
    ("collective_timeout_s", 0, "outside"),
    ("collective_timeout_s", 1.5, "whole number"),
    ("collective_timeout_s", 86400, "outside"),
])
def test_detection_numbers_must_make_sense(key, value, wanted):
    _unused, problems = contract_of(gms_failover={key: value})
    (msg,) = problems
    assert msg.startswith(f"gms_failover.{key}: ") and wanted in msg and "Fix: set" in msg, msg


def test_an_older_plan_without_the_new_settings_still_loads():
    plan = build_plan(contract_of()[0])
    data = plan.to_dict()
    for key in ("progress_stall_s", "canary_interval_s", "collective_timeout_s"):
        del data["failover"][key]
    assert Plan.from_dict(data).failover.progress_stall_s == DEFAULT_FAILOVER["progress_stall_s"]
    assert set(DEFAULT_FAILOVER) == {f.name for f in dataclasses.fields(Failover)}


def rank_of(plan: Plan, cohort: int, node_rank: int):
    return next(r for r in plan.cohort(cohort).ranks if r.node_rank == node_rank)


@pytest.mark.parametrize("name", ["dynamo_vllm", "standin"])
def test_every_rank_gets_the_watchdog_environment_and_timeout(name):
    contract, problems = contract_of(2, gms_engine={"backend": name, "tensor_parallel_size": 2},
                                     gms_failover={"collective_timeout_s": 45})
    assert problems == []
    plan = build_plan(contract)
    for cohort in plan.cohort_ids:
        for node_rank in (0, 1):
            rank = rank_of(plan, cohort, node_rank)
            env, argv = rank.process.env, rank.process.argv
            assert {k: env[k] for k in WATCHDOG_ENV} == {
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_ENABLE_MONITORING": "1",
                "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "45", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "1000"}
            assert argv[argv.index("--distributed-timeout-seconds") + 1] == "45"
            assert (argv[-1] == "--headless") == (node_rank == 1)
    for server in plan.gms_servers:  # the GMS server runs no collective
        assert not set(WATCHDOG_ENV) & set(server.env)


def test_default_timeout_is_torchs_own():
    plan = build_plan(contract_of()[0])
    rank = rank_of(plan, 0, 0)
    assert rank.process.env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "600"
    assert rank.process.argv[rank.process.argv.index("--distributed-timeout-seconds") + 1] == "600"


def test_dynamo_1_6_1_gets_no_rank_liveness_or_serving_timeout():
    """Neither DYN_GMS_RANK_LIVENESS nor DYN_GMS_SERVING_NCCL_TIMEOUT_S is in the 1.6.1 wheels: not rendered."""
    plan = build_plan(contract_of(2, gms_engine={"tensor_parallel_size": 2})[0])
    for cohort in plan.cohorts:
        for rank in cohort.ranks:
            assert not [k for k in rank.process.env if k.startswith("DYN_GMS_")]


def test_the_timeout_flag_is_managed_by_the_plan():
    assert MANAGED_FLAGS["--distributed-timeout-seconds"] == "gms_failover.collective_timeout_s"
    _unused, (msg,) = contract_of(gms_engine={"extra_args": ["--distributed-timeout-seconds=30"]})
    assert "--distributed-timeout-seconds" in msg and "gms_failover.collective_timeout_s" in msg


def test_exit_time_of_a_stuck_rank():
    assert dynamo_vllm.exit_after_s(5) == pytest.approx(9.0)  # 5 s timeout + 4 x 1 s dump wait
    assert dynamo_vllm.exit_after_s(600, 15000) == pytest.approx(660.0)  # torch's defaults: 11 minutes


def test_both_backends_serve_progress_metrics_on_the_system_port():
    assert backend("dynamo_vllm").progress_metrics_path == "/metrics"
    assert backend("standin").progress_metrics_path == "/metrics"


def test_no_backend_offers_the_agent_a_heartbeat_file():
    """Real engines write no heartbeat file and the stand-in offers none: the Backend interface has no such
    signal, only the leader's progress metrics (docs/detection.md)."""
    for name in ("dynamo_vllm", "standin"):
        assert not hasattr(backend(name), "progress_file") and not hasattr(backend(name), "progress_mtime")
