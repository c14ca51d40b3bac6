"""Contract parsing and preflight checks: every bad input is named with its fix, all at once."""

from __future__ import annotations

import json

import pytest

from shadowline.deployment.contract import parse_contract
from shadowline.deployment.preflight import run_preflight

from .helpers import hostvars


def problems_of(nodes: int = 1, **shared) -> list[str]:
    hv, hosts = hostvars(nodes, **shared)
    _unused, problems = parse_contract(hv, hosts)
    return [str(p) for p in problems]


def test_valid_contract_has_no_problems():
    assert problems_of(2, gms_engine={"tensor_parallel_size": 16}) == []


def test_string_where_number_belongs_is_named():
    (msg,) = problems_of(gms_engine={"tensor_parallel_size": "eight"})
    assert msg.startswith("gms_engine.tensor_parallel_size: must be a whole number, got the string 'eight'.")
    assert "Fix:" in msg


def test_all_problems_reported_together():
    msgs = problems_of(gms_deployment="Bad_Name", gms_cohorts="x", gms_ports={"fronted": 1},
                       gms_model={"revision": "main"}, gms_engine={"backend": "vllm"})
    fields = [m.split(":")[0] for m in msgs]
    assert fields == ["gms_deployment", "gms_engine.backend", "gms_cohorts", "gms_ports.fronted",
                      "gms_model.revision"], msgs


def test_typo_in_variable_name_suggests_the_right_one():
    msgs = problems_of(gms_cohort=3)
    assert msgs == ["gms_cohort: is not a shadowline variable and would be ignored. Fix: did you mean 'gms_cohorts'? "
                    "Rename it, or remove it."]


def test_rank_problems():
    hv, hosts = hostvars(3, gms_engine={"tensor_parallel_size": 24})
    hv["node2"]["gms_node_rank"] = 1
    _unused, problems = parse_contract(hv, hosts)
    assert [str(p) for p in problems] == [
        "gms_node_rank: rank 1 is given to node1 and node2; ranks must be unique. Fix: number the nodes 0..2, each once."]
    hv["node2"]["gms_node_rank"] = 5
    _unused, problems = parse_contract(hv, hosts)
    assert "missing [2]" in str(problems[0])


def test_shared_value_differs_between_hosts():
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 16})
    hv["node1"]["gms_cohorts"] = 3
    _unused, problems = parse_contract(hv, hosts)
    assert str(problems[0]).startswith("gms_cohorts (host node1): differs between node0 and node1")


def test_pickle_and_unpinned_allowed_when_asked():
    assert problems_of(gms_model={"revision": "main", "format": "pytorch"},
                       gms_model_allow_unpinned=True, gms_model_allow_pickle="true") == []


def test_managed_flag_in_extra_args_is_refused():
    (msg,) = problems_of(gms_engine={"extra_args": ["--master-port=1"]})
    assert "contains --master-port" in msg and "gms_ports.master_base" in msg


def facts(**overrides):
    modules = {"dynamo.vllm": True, "vllm": True, "gpu_memory_service": True}
    base = {"listening": [], "gpus": None, "python": {"exists": True, "modules": modules},
            "lock_dir": {"path": "/run/x", "exists": False, "existing_ancestor": "/run", "ancestor_is_dir": True,
                         "fstype": "tmpfs", "mountpoint": "/run", "read_only": False},
            "manifest_weight_bytes": None}
    base.update(overrides)
    return base


def preflight(node_facts: dict, nodes: int = 1, **shared) -> list[str]:
    hv, hosts = hostvars(nodes, **shared)
    result = run_preflight(hv, hosts, [], {h: node_facts for h in hosts})
    return [str(p) for p in result.problems]


def test_lock_on_network_filesystem_is_refused():
    lock = {**facts()["lock_dir"], "fstype": "nfs4", "mountpoint": "/shared"}
    (msg,) = preflight(facts(lock_dir=lock))
    assert msg.startswith("gms_lock_path (host node0): /run/shadowline/llama/gms/failover.lock is on nfs4")


def test_gpu_count_must_match_nvidia_smi():
    gpus = [{"uuid": f"GPU-{i}", "memory_mib": 81920.0} for i in range(4)]
    (msg,) = preflight(facts(gpus=gpus))
    assert "is 8 but nvidia-smi lists 4 GPU(s)" in msg


def test_memory_budget_counts_weights_once_and_overhead_per_engine():
    gpus = [{"uuid": f"GPU-{i}", "memory_mib": 81920.0} for i in range(8)]
    weights = 140 * 1024 ** 3
    assert preflight(facts(gpus=gpus, manifest_weight_bytes=weights), gms_cohorts=4) == []
    assert preflight(facts(gpus=gpus, manifest_weight_bytes=weights), gms_cohorts=3,
                     gms_engine={"tensor_parallel_size": 2, "gpus_per_node": 8}) == []  # 70 + 3 x 3 GiB fits
    (msg,) = preflight(facts(gpus=gpus, manifest_weight_bytes=weights), gms_cohorts=4,
                       gms_engine={"tensor_parallel_size": 2, "gpus_per_node": 8})
    assert msg.startswith("gms_memory: each GPU needs 82.0 GiB (weights 140.0 GiB / TP 2 + KV reserve 0 GiB + "
                          "4 engines x 3 GiB overhead) but has 80.0 GiB.")
    (msg,) = preflight(facts(gpus=gpus), gms_memory={"weights_gib": 150, "kv_reserve_gib": 8},
                       gms_engine={"tensor_parallel_size": 2, "gpus_per_node": 8})
    assert "each GPU needs 89.0 GiB" in msg and "has 80.0 GiB" in msg


def test_a_new_model_revision_is_budgeted_beside_the_served_one():
    """A revision switch keeps the served revision's weights resident until every cohort runs the new one."""
    gpus = [{"uuid": f"GPU-{i}", "memory_mib": 81920.0} for i in range(8)]
    engine = {"tensor_parallel_size": 2, "gpus_per_node": 8}
    memory = {"engine_overhead_gib": 1.0}  # the arithmetic below: 1 GiB per engine
    hv, _hosts = hostvars(1)
    served = {"revision": "f" * 40, "model_dir": "/m/old", "tensor_parallel_size": 2, "weight_bytes": 100 * 1024 ** 3}
    new = 100 * 1024 ** 3
    # alone, the new revision fits (50 + 4 GiB); beside the served one it does not (50 + 50 + 4 GiB)
    assert preflight(facts(gpus=gpus, manifest_weight_bytes=new), gms_cohorts=4, gms_engine=engine, gms_memory=memory) == []
    (msg,) = preflight(facts(gpus=gpus, manifest_weight_bytes=new, running_model=served), gms_cohorts=4,
                       gms_engine=engine, gms_memory=memory)
    assert msg.startswith(f"gms_model.revision: switching the served revision {'f' * 40} to "
                          f"{hv['node0']['gms_model']['revision']} keeps both in GPU memory"), msg
    assert "each GPU needs 104.0 GiB (the served revision's weights 100.0 GiB / TP 2 + the new revision's" in msg
    assert "has 80.0 GiB" in msg and "playbooks/teardown.yml" in msg
    # not staged yet: the new revision is assumed the served one's size
    (msg,) = preflight(facts(gpus=gpus, running_model=served), gms_cohorts=4, gms_engine=engine, gms_memory=memory)
    assert "each GPU needs 104.0 GiB" in msg
    # a smaller model fits twice; the same revision (a deployment changing other things) is budgeted once
    small = {**served, "weight_bytes": 20 * 1024 ** 3}
    assert preflight(facts(gpus=gpus, manifest_weight_bytes=20 * 1024 ** 3, running_model=small), gms_cohorts=4,
                     gms_engine=engine, gms_memory=memory) == []
    same = {**served, "revision": hv["node0"]["gms_model"]["revision"]}
    assert preflight(facts(gpus=gpus, manifest_weight_bytes=new, running_model=same), gms_cohorts=4,
                     gms_engine=engine, gms_memory=memory) == []


def test_port_in_use_by_someone_else_but_not_by_us():
    busy = [{"port": 8081, "address": "0.0.0.0", "pid": 42, "process": "nginx", "ours": False},
            {"port": 8080, "address": "0.0.0.0", "pid": 43, "process": "python", "ours": True}]
    (msg,) = preflight(facts(listening=busy))
    assert msg == ("gms_ports.system_base (host node0): port 8081 (cohort 1 system port) is already in use by nginx "
                   "(pid 42) on 0.0.0.0. Fix: stop that process, or move gms_ports.system_base to a free port.")


def test_runtime_without_gms_is_refused_for_real_backend():
    python = {"exists": True, "modules": {"dynamo.vllm": True, "gpu_memory_service": False}}
    (msg,) = preflight(facts(python=python))
    assert "cannot import gpu_memory_service" in msg


def test_failover_settings_are_checked_with_their_fix():
    assert problems_of(gms_failover={"planned_grace_s": -1}) == [
        "gms_failover.planned_grace_s: is -1, but must be at least 0 and at most 3600. Fix: set "
        "gms_failover.planned_grace_s to a number at least 0 and at most 3600, e.g. 5."]
    (msg,) = problems_of(gms_failover={"planned_grace_s": "soon"})
    assert msg.startswith("gms_failover.planned_grace_s: must be a number, got the string 'soon'.")
    assert problems_of(gms_failover={"planed_grace_s": 5}) == [
        "gms_failover.planed_grace_s: is not a known key. Fix: did you mean 'planned_grace_s'? Rename it, or remove it."]


@pytest.mark.parametrize("key, value, wanted", [
    ("health_timeout_s", float("nan"), "must be a number"),  # nan would switch hang detection off
    ("health_timeout_s", "nan", "must be a number"),
    ("progress_stall_s", float("inf"), "must be a number"),
    ("health_timeout_s", 0, "must be above 0"),
    ("relaunch_backoff_s", -0.5, "must be above 0"),
    ("stable_after_s", 1e9, "at most 86400"),
    ("term_grace_s", True, "must be a number"),
])
def test_failover_numbers_must_make_sense(key, value, wanted):
    (msg,) = problems_of(gms_failover={key: value})
    assert msg.startswith(f"gms_failover.{key}: ") and wanted in msg and "Fix: set" in msg, msg


def test_relaunch_backoff_must_not_exceed_its_maximum():
    assert problems_of(gms_failover={"relaunch_backoff_s": 10, "relaunch_backoff_max_s": 2}) == [
        "gms_failover.relaunch_backoff_max_s: is 2, below relaunch_backoff_s (10): the delay could never grow. "
        "Fix: set relaunch_backoff_max_s to at least relaunch_backoff_s."]
    assert problems_of(gms_failover={"relaunch_backoff_s": 2, "relaunch_backoff_max_s": 2}) == []


@pytest.mark.parametrize("field, value", [
    ("gms_node_address", '10.0.0.1"\nlisten: "0.0.0.0'),
    ("gms_node_address", "10.0.0.1 10.0.0.2"),
    ("gms_node_address", "-oProxyCommand=x"),
    ("ansible_host", "node0\nEnvironment=X=1"),
    ("gms_node_address", "gpu-01.example\r"),
])
def test_node_addresses_are_addresses_or_host_names(field, value):
    """A quote, space or newline in an address would land in NATS's configuration and the units (issue #13)."""
    hv, hosts = hostvars(2)
    hv["node1"][field] = value
    _unused, problems = parse_contract(hv, hosts)
    assert [(p.field, p.host) for p in problems] == [(field, "node1")], problems
    assert "neither an IP address nor a DNS host name" in problems[0].message and "IP address" in problems[0].fix


def test_infra_and_frontend_addresses_are_checked():
    hv, hosts = hostvars(1)
    hv["infra0"] = {"ansible_host": "10.0.0.9'"}
    _unused, problems = parse_contract(hv, hosts, ["infra0"])
    assert [(p.field, p.host) for p in problems] == [("ansible_host", "infra0")]
    assert problems_of(1, gms_frontend_bind="0.0.0.0 ") == [
        "gms_frontend_bind: must be an address, got the string '0.0.0.0 '. Fix: set it to the infra node's cluster "
        "address (or 0.0.0.0), or leave it unset for that default."]


@pytest.mark.parametrize("value", ["10.0.0.5", "fd00::5", "gpu-01.cluster.example", "node_1", "localhost."])
def test_plain_addresses_pass(value):
    hv, hosts = hostvars(1)
    hv["node0"]["gms_node_address"] = value
    assert parse_contract(hv, hosts)[1] == []


# -- platforms (issue #16) ------------------------------------------------------------------------------------ #
def _platform(id_: str, version: str, python=(3, 11, 2), pretty: str = "") -> dict:
    return {"id": id_, "version_id": version, "pretty_name": pretty, "python": list(python)}


@pytest.mark.parametrize("platform", [_platform("debian", "12"), _platform("ubuntu", "24.04")])
def test_supported_platforms_pass_as_nodes_and_infra(platform):
    assert preflight(facts(platform=platform)) == []


def test_an_unsupported_distribution_is_named_with_what_is_supported():
    (msg,) = preflight(facts(platform=_platform("rocky", "9.4", pretty="Rocky Linux 9.4 (Blue Onyx)")))
    assert msg.startswith("(platform) (host node0): the host runs Rocky Linux 9.4 (Blue Onyx), which shadowline "
                          "does not support as an infra host (etcd, NATS, the frontend); supported: Debian 12, "
                          "Ubuntu 24.04.")  # node0 is also the infra host here (gms_infra empty)


def test_ubuntu_2204_carries_gpu_nodes_but_not_the_infra():
    hv, hosts = hostvars(2)
    infra_vars = {"ansible_host": "198.18.0.30"}
    hv["infra0"] = {**hv["node0"], **infra_vars}
    del hv["infra0"]["gms_node_rank"]
    jammy = facts(platform=_platform("ubuntu", "22.04", pretty="Ubuntu 22.04.4 LTS"))
    result = run_preflight(hv, hosts, ["infra0"], {"node0": jammy, "node1": jammy, "infra0": jammy})
    assert [(p.field, p.host) for p in result.problems] == [("gms_infra", "infra0")], result.problems
    assert "etcd-server is 3.3" in result.problems[0].message


def test_a_python_older_than_38_is_refused():
    (msg,) = preflight(facts(platform=_platform("debian", "12", python=(3, 6, 8))))
    assert msg.startswith("ansible_python_interpreter (host node0): the node's Python is 3.6.8;")


def test_gms_binaries_are_absolute_paths_and_reach_the_plan():
    assert problems_of(gms_binaries={"etcd": "etcd"}) == [
        "gms_binaries.etcd: must be an absolute path without spaces, got the string 'etcd'. Fix: set "
        "gms_binaries.etcd to an absolute path such as /usr/bin/etcd."]
    assert problems_of(gms_binaries={"etcdd": "/opt/etcd/etcd"})[0].startswith("gms_binaries.etcdd: is not a known key.")
    hv, hosts = hostvars(1, gms_binaries={"etcd": "/opt/etcd-v3.5.17/etcd"})
    result = run_preflight(hv, hosts, [], {h: facts() for h in hosts})
    assert result.plan is not None
    argv = {p["argv"][0] for p in result.plan.to_dict()["infra"]["etcd"]} | {
        p["argv"][0] for p in result.plan.to_dict()["infra"]["nats"]}
    assert argv == {"/opt/etcd-v3.5.17/etcd", "/usr/sbin/nats-server"}
    assert problems_of(gms_binaries={"haproxy": "haproxy"}) == [
        "gms_binaries.haproxy: must be an absolute path without spaces, got the string 'haproxy'. Fix: set "
        "gms_binaries.haproxy to an absolute path such as /usr/sbin/haproxy."]


def test_the_etcd_proxys_ports_are_in_the_collision_checks():
    """The etcd proxy keeps three loopback ports from gms_ports.etcd_proxy (one per possible member): one that
    lands on another port of the deployment is refused, naming both."""
    from shadowline.deployment.ports import port_problems

    hv, hosts = hostvars(1, gms_ports={"etcd_proxy": 8479})  # 8479, 8480 (the agent's metrics), 8481
    contract, problems = parse_contract(hv, hosts)
    assert contract is not None and problems == []
    assert [str(p) for p in port_problems(contract)] == [
        "gms_ports.etcd_proxy: port 8480 is used by both the agent metrics and the etcd proxy to member 2 "
        "(loopback) on node0. Fix: move gms_ports.etcd_proxy or gms_ports.agent_metrics so no two processes of a "
        "host share a port (each cohort takes one master, one system and one NIXL port)."]


# -- the runtime's source, by python_env_mode (issue #16) ----------------------------------------------------- #
def test_venv_mode_cannot_deliver_the_gpu_runtime():
    (msg,) = preflight(facts(runtime_mode="venv"), gms_engine={"backend": "dynamo_vllm"})
    assert msg.startswith("python_env_mode (host node0): is venv, which installs from the package index, but the "
                          "dynamo_vllm backend needs gpu-memory-service, which is not on PyPI.")
    assert preflight(facts(runtime_mode="venv"), gms_engine={"backend": "standin"}) == []


def test_a_wheelhouse_is_checked_for_every_wheel_and_a_missing_one_named():
    full = {"path": "/srv/wh", "exists": True,
            "projects": ["ai-dynamo", "ai-dynamo-runtime", "gpu-memory-service", "torch", "vllm"]}
    python = {"exists": False, "modules": {}}  # not built yet: that is what python_env does next
    assert preflight(facts(runtime_mode="wheelhouse", wheelhouse=full, python=python)) == []
    (msg,) = preflight(facts(runtime_mode="wheelhouse", python=python,
                             wheelhouse={**full, "projects": ["ai-dynamo", "torch"]}))
    assert "/srv/wh has no wheel of ai-dynamo-runtime, vllm, gpu-memory-service." in msg
    (msg,) = preflight(facts(runtime_mode="wheelhouse", python=python,
                             wheelhouse={"path": "/srv/wh", "exists": False, "error": "No such file or directory"}))
    assert msg.startswith("python_env_wheelhouse (host node0): /srv/wh cannot be read (No such file or directory).")


def test_an_unknown_runtime_mode_is_refused_up_front():
    (msg,) = preflight(facts(runtime_mode="conda"))
    assert msg == ("python_env_mode (host node0): is 'conda'. Fix: use one of venv, wheelhouse, external, container.")


def test_wheel_file_names_give_their_project():
    from shadowline.deployment.node_facts import project_name
    assert project_name("gpu_memory_service-0.1.0-py3-none-any.whl") == "gpu-memory-service"
    assert project_name("ai_dynamo_runtime-1.6.1-cp310-abi3-manylinux_2_28_x86_64.whl") == "ai-dynamo-runtime"
    assert project_name("Torch-2.13.0-cp311-cp311-linux_x86_64.whl") == "torch"


def test_the_running_model_is_read_from_the_plan_the_agents_follow(tmp_path):
    """node_facts.running_model: the revision, directory, TP size and weight bytes of the plan.json on a node."""
    from shadowline.deployment.node_facts import MANIFEST_NAME, running_model, running_plan
    from shadowline.deployment.plan_builder import build_plan

    assert running_model(running_plan(str(tmp_path))) is None  # before a first deployment
    hv, hosts = hostvars(2, gms_engine={"tensor_parallel_size": 2})
    plan = build_plan(parse_contract(hv, hosts)[0])
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / MANIFEST_NAME).write_text(json.dumps({"weight_bytes": 6291456}))
    data = {**plan.to_dict(), "model_dir": str(model_dir)}
    (tmp_path / "plan.json").write_text(json.dumps(data))
    assert running_model(running_plan(str(tmp_path))) == {"revision": plan.revision, "model_dir": str(model_dir),
                                                          "tensor_parallel_size": 2, "weight_bytes": 6291456}
    (tmp_path / "plan.json").write_text("{not json")
    assert running_model(running_plan(str(tmp_path))) is None


def test_gms_insecure_is_not_switched_on_a_running_deployment(tmp_path, monkeypatch):
    """Switching gms_insecure in place left etcd refusing every client (its authentication is kept in its data):
    on the testbed the plain frontend then exited at every start ("etcdserver: user name is empty"). Refused by
    preflight, naming the field and the way (teardown first); the same setting again, or a first deployment, pass."""
    from shadowline.deployment.node_facts import gather
    from shadowline.deployment.plan_builder import build_plan

    assert preflight(facts(running_secure=True)) == []  # secure by default, as it runs
    (msg,) = preflight(facts(running_secure=True), gms_insecure=True)
    assert msg.startswith("gms_insecure: deployment llama runs with its control plane secured"), msg
    assert "keep gms_insecure as it is (unset), or run playbooks/teardown.yml first" in msg
    (msg,) = preflight(facts(running_secure=False))
    assert "runs with its control plane plain (gms_insecure: true)" in msg and "(true)" in msg
    assert preflight(facts(running_secure=False), gms_insecure=True) == []
    assert preflight(facts(running_secure=None), gms_insecure=True) == []  # nothing deployed yet
    hv, hosts = hostvars(2, gms_insecure=True)  # nodes that disagree (a switch made before this check): let it repair
    mixed = {"node0": facts(running_secure=True), "node1": facts(running_secure=False)}
    assert run_preflight(hv, hosts, [], mixed).problems == []

    config = tmp_path / "etc" / "shadowline" / "llama"
    config.mkdir(parents=True)
    monkeypatch.setattr("shadowline.deployment.node_facts.CONFIG_DIR", str(tmp_path / "etc/shadowline/{deployment}"))
    assert gather("llama", None, None, None, None, None)["running_secure"] is None
    for insecure in (False, True):
        hv, hosts = hostvars(1, gms_insecure=insecure)
        (config / "plan.json").write_text(json.dumps(build_plan(parse_contract(hv, hosts)[0]).to_dict()))
        assert gather("llama", None, None, None, None, None)["running_secure"] is (not insecure)


# -- paths (issue #42: teardown must never be pointed at a directory the deployment does not own) --------------- #

PATH_FIELDS = {  # field -> (the variables that set it to a value, a good value)
    "gms_socket_dir": (lambda v: {"gms_socket_dir": v}, "/srv/shadowline/llama/gms"),
    "gms_lock_path": (lambda v: {"gms_lock_path": v}, "/srv/shadowline/llama/failover.lock"),
    "gms_python": (lambda v: {"gms_python": v}, "/srv/shadowline/venv/bin/python"),
    "gms_model.local_dir": (lambda v: {"gms_model": {"local_dir": v}}, "/srv/models/llama/rev"),
    "gms_secrets_dir": (lambda v: {"gms_secrets_dir": v}, "/srv/secrets/llama"),
    "gms_model_hf_token_file": (lambda v: {"gms_model_hf_token_file": v}, "/etc/shadowline/hf-token"),
    "gms_binaries.etcd": (lambda v: {"gms_binaries": {"etcd": v}}, "/srv/bin/etcd"),
}


def path_problems(field: str, value) -> list[str]:
    variables, _good = PATH_FIELDS[field]
    return problems_of(**variables(value))


@pytest.mark.parametrize("field", sorted(PATH_FIELDS))
def test_every_path_variable_takes_a_plain_deep_path(field):
    assert path_problems(field, PATH_FIELDS[field][1]) == []


@pytest.mark.parametrize("field", sorted(PATH_FIELDS))
@pytest.mark.parametrize("value, wanted", [
    ("/", "is /, the root directory"),
    ("/tmp", "is /tmp, a system directory"),
    ("/dev/shm", "is /dev/shm, a system directory"),
    ("/etc", "is /etc, a system directory"),
    ("/var/lib", "is /var/lib, a system directory"),
    ("/usr/local/bin", "is /usr/local/bin, a system directory"),
    ("/shadowline", "is /shadowline, directly below /: a deployment's path must be at least 2 levels deep"),
    ("/run/shadowline/../../etc/failover.lock", "'/run/shadowline/../../etc/failover.lock' is not written as the "
                                                "path itself ('.', '..', '//' or a trailing '/'); it means /etc/failover.lock."),
    ("/srv/./gms", "it means /srv/gms"),
    ("/srv//gms", "it means /srv/gms"),
    ("/srv/gms/", "it means /srv/gms"),
    ("relative/gms", "must be an absolute path"),
])
def test_a_path_variable_is_refused_naming_the_field_and_the_fix(field, value, wanted):
    msgs = path_problems(field, value)
    assert len(msgs) == 1 and msgs[0].startswith(f"{field}: "), msgs
    assert wanted in msgs[0] and " Fix: " in msgs[0], msgs


def test_the_issue_42_paths_are_refused():
    """The paths of issue #42 that preflight passed and teardown would have removed (or their parents)."""
    msgs = problems_of(gms_socket_dir="/", gms_lock_path="/run/shadowline/../../etc/failover.lock",
                       gms_model={"local_dir": "/etc"})
    assert [m.split(":")[0] for m in msgs] == ["gms_model.local_dir", "gms_socket_dir", "gms_lock_path"], msgs
    assert "Fix: set gms_socket_dir to a path of the deployment's own below it, such as /run/shadowline/" in msgs[1]
    # two levels deep below a system directory is the deployment's own (teardown removes only what it made there)
    assert problems_of(gms_socket_dir="/tmp/gms", gms_model={"local_dir": "/dev/shm/models/llama"}) == []


def test_controller_paths_take_the_home_directory_but_not_home_itself():
    assert problems_of(gms_secrets_dir="~/.shadowline/secrets/llama", gms_model_hf_token_file="~/hf-token") == []
    (msg,) = problems_of(gms_secrets_dir="~/")
    assert msg.startswith("gms_secrets_dir: '~/' is not written as the path itself"), msg
    (msg,) = problems_of(gms_secrets_dir="~/a/../../etc")
    assert "it means ~/etc" in msg, msg


def test_the_system_directories_have_one_home():
    from shadowline.common.values import SYSTEM_DIRECTORIES, path_problem

    for directory in ("/", "/tmp", "/dev/shm", "/etc", "/var/run", "/var/tmp", "/usr/local/bin", "/run"):
        assert directory in SYSTEM_DIRECTORIES
        assert path_problem(directory) is not None
    assert all(d == "/" or path_problem(d + "/x/y") is None for d in SYSTEM_DIRECTORIES)
