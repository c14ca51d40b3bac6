"""The cohort plan: ports, ranks, headless flags, argv and environment for every backend and shape."""

from __future__ import annotations

import pytest

from shadowline.backends.standin import gpu_uuids
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan import Plan, residency_of
from shadowline.deployment.plan_builder import build_plan
from shadowline.deployment.ports import port_problems

from .helpers import hostvars


def plan_for(nodes: int, **shared) -> Plan:
    hv, hosts = hostvars(nodes, **shared)
    contract, problems = parse_contract(hv, hosts)
    assert problems == [], [str(p) for p in problems]
    assert contract is not None
    return build_plan(contract)


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_upstream_recipe_cohort1_of_two_node_group():
    plan = plan_for(2, gms_engine={"tensor_parallel_size": 16})
    cohort = plan.cohort(1)
    assert (cohort.ports.master, cohort.ports.system, cohort.ports.nixl) == (29600, 8081, 8281)
    assert cohort.role == "shadow" and cohort.engine_id == 1
    rank0, rank1 = cohort.ranks
    assert "--headless" not in rank0.process.argv
    assert rank1.process.argv[-1] == "--headless"
    assert flag(rank1.process.argv, "--master-port") == "29600"
    assert flag(rank1.process.argv, "--master-addr") == "198.18.0.10"
    assert flag(rank1.process.argv, "--node-rank") == "1"
    assert rank1.process.env["DYN_SYSTEM_PORT"] == "8081"
    assert rank1.process.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "8281"
    assert rank1.process.env["ENGINE_ID"] == "1"


def test_single_node_has_no_multinode_flags():
    plan = plan_for(1)
    for cohort in plan.cohorts:
        (rank,) = cohort.ranks
        assert rank.leader and not rank.headless
        for name in ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless",
                     "--distributed-executor-backend"):
            assert name not in rank.process.argv


def test_real_backend_command_matches_contract():
    plan = plan_for(2, gms_engine={"tensor_parallel_size": 16})
    argv = plan.cohort(0).ranks[0].process.argv
    assert argv[:3] == ("/opt/shadowline/llama/venv/bin/python", "-m", "dynamo.vllm")
    for required in ("--load-format", "--enforce-eager", "--enable-sleep-mode"):
        assert required in argv
    assert flag(argv, "--load-format") == "gms"
    assert flag(argv, "--tensor-parallel-size") == "16"
    assert flag(argv, "--distributed-executor-backend") == "mp"
    assert flag(argv, "--nnodes") == "2"
    env = plan.cohort(0).ranks[0].process.env
    assert env["DYN_VLLM_GMS_SHADOW_MODE"] == "true"
    assert env["FAILOVER_LOCK_PATH"] == "/run/shadowline/llama/gms/failover.lock"
    assert env["GMS_SOCKET_DIR"] == "/run/shadowline/llama/gms/rev-0123456789ab"  # the revision's residency
    assert env["ETCD_ENDPOINTS"] == "http://127.0.0.1:23790"  # the host's etcd proxy (TLS to the member)
    assert env["NATS_SERVER"] == "tls://198.18.0.10:4222"  # TLS with the deployment's certificates
    assert env["NATS_TLS_CLIENT_KEY_PATH"] == "/etc/shadowline/llama/secrets/client.key"
    assert env["ETCD_LEASE_TTL"] == "30"
    assert plan.gms_servers[0].argv[1:] == ("-m", "gpu_memory_service.cli.server")
    assert "SHADOWLINE_STANDIN_GPUS" not in env


def test_standin_differs_only_in_executable():
    real = plan_for(2, gms_engine={"tensor_parallel_size": 2, "gpus_per_node": 1})
    standin = plan_for(2, gms_engine={"tensor_parallel_size": 2, "gpus_per_node": 1, "backend": "standin"})
    for a, b in zip(real.cohorts, standin.cohorts):
        for ra, rb in zip(a.ranks, b.ranks):
            assert ra.process.argv[2] == "dynamo.vllm" and rb.process.argv[2] == "shadowline.standin.engine"
            assert ra.process.argv[3:] == rb.process.argv[3:]
            extra = {k: v for k, v in rb.process.env.items() if k not in ra.process.env}
            assert list(extra) == ["SHADOWLINE_STANDIN_GPUS"]
    uuids = standin.cohort(0).ranks[1].process.env["SHADOWLINE_STANDIN_GPUS"].split(",")
    assert uuids == gpu_uuids("llama", "node1", 1)
    assert standin.gms_servers[1].env["SHADOWLINE_STANDIN_GPUS"] == ",".join(uuids)


@pytest.mark.parametrize("nodes", [1, 2, 8])
@pytest.mark.parametrize("shadows", [1, 2, 3, 4])
def test_every_rank_of_every_cohort(nodes: int, shadows: int):
    plan = plan_for(nodes, gms_cohorts=shadows + 1, gms_engine={"tensor_parallel_size": 8 * nodes})
    assert [c.role for c in plan.cohorts] == ["primary"] + ["shadow"] * shadows
    assert [c.engine_id for c in plan.cohorts] == list(range(shadows + 1))
    masters = [c.ports.master for c in plan.cohorts]
    assert masters == [29500 + 100 * i for i in range(shadows + 1)]
    assert [c.ports.system for c in plan.cohorts] == [8080 + i for i in range(shadows + 1)]
    assert [c.ports.nixl for c in plan.cohorts] == [8280 + i for i in range(shadows + 1)]
    for cohort in plan.cohorts:
        assert [r.node_rank for r in cohort.ranks] == list(range(nodes))
        assert [r.leader for r in cohort.ranks] == [True] + [False] * (nodes - 1)
        assert [r.headless for r in cohort.ranks] == [False] + [True] * (nodes - 1)
        for rank in cohort.ranks:
            assert rank.process.env["ENGINE_ID"] == str(cohort.engine_id)
            assert rank.process.env["DYN_SYSTEM_HOST"] == rank.address
            if nodes > 1:
                assert flag(rank.process.argv, "--master-port") == str(cohort.ports.master)
                assert flag(rank.process.argv, "--node-rank") == str(rank.node_rank)
    assert port_problems(plan_contract(nodes, shadows)) == []


def plan_contract(nodes: int, shadows: int):
    hv, hosts = hostvars(nodes, gms_cohorts=shadows + 1, gms_engine={"tensor_parallel_size": 8 * nodes})
    contract, _unused = parse_contract(hv, hosts)
    assert contract is not None
    return contract


def test_tensor_parallel_inside_a_node():
    plan = plan_for(1, gms_engine={"tensor_parallel_size": 4, "gpus_per_node": 8})
    assert flag(plan.cohort(0).ranks[0].process.argv, "--tensor-parallel-size") == "4"


def test_extra_args_are_appended_verbatim():
    plan = plan_for(1, gms_engine={"extra_args": ["--max-model-len", "8192", "--gpu-memory-utilization=0.85"]})
    assert plan.cohort(1).ranks[0].process.argv[-3:] == ("--max-model-len", "8192", "--gpu-memory-utilization=0.85")


def test_three_infra_hosts_give_every_endpoint():
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16})
    for i, name in enumerate(["infra0", "infra1", "infra2"]):
        hv[name] = {"ansible_host": f"198.18.1.{i + 1}"}
    contract, problems = parse_contract(hv, hosts, ["infra0", "infra1", "infra2"])
    assert not problems and contract is not None
    plan = build_plan(contract)
    assert plan.infra.etcd_endpoints == "https://198.18.1.1:2379,https://198.18.1.2:2379,https://198.18.1.3:2379"
    # one member (test_security.py), through the host's etcd proxy: a loopback port per member
    assert plan.cohort(0).ranks[0].process.env["ETCD_ENDPOINTS"] == "http://127.0.0.1:23790"
    assert plan.cohort(1).ranks[1].process.env["ETCD_ENDPOINTS"] == "http://127.0.0.1:23791"
    assert plan.infra.frontend.host == "infra0"
    assert flag(plan.infra.frontend.argv, "--migration-limit") == "3"


def test_the_router_mode_is_rendered_only_when_not_dynamos_default():
    assert "--router-mode" not in plan_for(2).infra.frontend.argv  # round-robin: Dynamo 1.6.1's default
    for mode in ("kv", "least-loaded", "power-of-two", "random"):
        assert flag(plan_for(2, gms_frontend_router_mode=mode).infra.frontend.argv, "--router-mode") == mode


def test_an_unknown_router_mode_is_refused_naming_the_field_and_the_choices():
    hv, hosts = hostvars(2, gms_frontend_router_mode="kv-aware")
    contract, problems = parse_contract(hv, hosts, [])
    assert contract is None
    (problem,) = [str(p) for p in problems]
    assert problem.startswith("gms_frontend_router_mode: is the string 'kv-aware', not one of round-robin, random, "
                              "power-of-two, least-loaded, kv. Fix: set gms_frontend_router_mode to one of"), problem


def test_numbers_from_extra_vars_strings_are_accepted():
    plan = plan_for(2, gms_cohorts="3", gms_engine={"tensor_parallel_size": "16", "gpus_per_node": "8"})
    assert len(plan.cohorts) == 3


def test_plan_dict_is_json_ready():
    data = plan_for(2, gms_engine={"tensor_parallel_size": 16}).to_dict()
    assert data["cohorts"][1]["ranks"][1]["process"]["argv"][-1] == "--headless"
    assert data["cohorts"][1]["ports"] == {"master": 29600, "system": 8081, "nixl": 8281}


def test_custom_ports_and_paths():
    plan = plan_for(1, gms_ports={"master_base": 31000, "master_stride": 10, "system_base": 9100, "nixl_base": 9300},
                    gms_socket_dir="/srv/gms", gms_cohorts=3)
    assert [c.ports.master for c in plan.cohorts] == [31000, 31010, 31020]
    assert plan.lock_path == "/srv/gms/failover.lock"


def test_the_dict_form_round_trips_to_the_same_typed_plan():
    """One boundary: to_dict for Ansible (gms_plan, plan.json), from_dict back for every Python consumer."""
    import json

    hv, hosts = hostvars(3, gms_python="/usr/bin/python3", gms_engine={"tensor_parallel_size": 3})
    contract, problems = parse_contract(hv, hosts)
    assert not problems
    plan = build_plan(contract)
    data = json.loads(json.dumps(plan.to_dict()))
    assert Plan.from_dict(data) == plan
    assert Plan.from_dict(data).to_dict() == data
    newer = {**data, "tls": {"ca": "/etc/x"}}  # a key of a newer plan is carried, not lost
    assert Plan.from_dict(newer).to_dict()["tls"] == {"ca": "/etc/x"}
    assert plan.python == "/usr/bin/python3" and plan.leader_node.rank == 0
    assert plan.cohort(1).leader.host == plan.leader_node.host and plan.cohort(1).holder == "engine-1"
    assert plan.unit_name("engine", 1) == f"shadowline-{plan.deployment}-engine@1.service"


def test_each_model_revision_has_a_gms_residency_of_its_own():
    """A GMS server unit and socket directory per revision (its first 12 characters); the lock is shared."""
    hv, hosts = hostvars(2)
    plan = build_plan(parse_contract(hv, hosts)[0])
    rev = plan.revision
    assert plan.unit_name("gms") == f"shadowline-{plan.deployment}-gms@{rev[:12]}.service"
    assert plan.gms_dir == f"{plan.socket_dir}/rev-{rev[:12]}"
    assert {p.env["GMS_SOCKET_DIR"] for p in plan.gms_servers} == {plan.gms_dir}
    assert {r.process.env["GMS_SOCKET_DIR"] for c in plan.cohorts for r in c.ranks} == {plan.gms_dir}
    shared = {k: v for k, v in hv[hosts[0]].items() if k.startswith("gms_")}
    model = {**shared["gms_model"], "revision": "f" * 40}
    model.pop("local_dir", None)
    hv2 = {h: {**v, "gms_model": model} for h, v in hv.items()}
    other = build_plan(parse_contract(hv2, hosts)[0])
    assert other.unit_name("gms") == f"shadowline-{plan.deployment}-gms@ffffffffffff.service"
    assert other.gms_dir != plan.gms_dir and other.lock_path == plan.lock_path
    assert residency_of("refs/pr/7 x") == "refs_pr_7_x" and residency_of("") == "unpinned"


def test_relaunch_policy_backs_off_and_gives_up():
    from shadowline.common.policy import RelaunchPolicy
    from shadowline.common.settings import DEFAULT_FAILOVER, Failover
    policy = RelaunchPolicy.of(Failover(**{**DEFAULT_FAILOVER, "relaunch_backoff_s": 0.5, "relaunch_backoff_max_s": 3.0,
                                           "max_relaunch_attempts": 3, "stable_after_s": 30.0}))
    assert [policy.delay(n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]
    assert policy.attempts_after(2, 5.0) == 3 and policy.attempts_after(2, 31.0) == 0
    assert policy.attempts_after(0, None) == 1  # a launch that failed to start counts as quick
    assert not policy.gives_up(3) and policy.gives_up(4)
