"""python_env_mode container (issue #16): gms_container parsed and checked with the backend's defaults, and the
units that run the plan's argv unchanged in the image through podman. The testbed drill in
tests/e2e/test_container.py proves the same units on hosts."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from shadowline.deployment import units
from shadowline.deployment.container import container_name, runtime_check_argv
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan import Plan
from shadowline.deployment.plan_builder import build_plan

from .helpers import hostvars

SITE = "/opt/shadowline/llama/venv/lib/python3.11/site-packages"


def contract_of(mode: str | None = "container", **shared):
    shared.setdefault("gms_engine", {"tensor_parallel_size": 16})
    hv, hosts = hostvars(2, **shared)
    for host in hosts:
        if mode is not None:
            hv[host]["python_env_mode"] = mode
    return parse_contract(hv, hosts)


def plan_of(**shared) -> Plan:
    contract, problems = contract_of(**shared)
    assert not problems, [str(p) for p in problems]
    return build_plan(contract)


def test_dynamo_vllm_defaults_to_nvidias_image_with_every_gpu_through_cdi():
    plan = plan_of()
    assert plan.container is not None
    assert plan.container.image == "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1"
    assert plan.container.devices == ("nvidia.com/gpu=all",)
    rank = plan.cohort(1).rank_on("node1").process
    assert rank.argv[:3] == ("python3", "-m", "dynamo.vllm")  # the image's interpreter ...
    assert plan.python == "/opt/shadowline/llama/venv/bin/python"  # ... the host's for the agent
    assert Plan.from_dict(plan.to_dict()) == plan


def test_the_standin_defaults_to_its_local_image_without_devices():
    plan = plan_of(gms_engine={"backend": "standin", "tensor_parallel_size": 2, "gpus_per_node": 1})
    assert plan.container is not None
    assert plan.container.image == "localhost/shadowline/standin-runtime:1.6.1" and plan.container.devices == ()


def test_other_modes_have_no_container_and_gms_container_alone_is_refused():
    contract, problems = contract_of(mode=None)
    assert not problems and contract is not None and contract.container is None
    _unused, problems = contract_of(mode="venv", gms_container={"runtime": "runc"})
    assert [str(p) for p in problems] == [
        "gms_container: is set, but python_env_mode is the string 'venv'. Fix: set python_env_mode: container to "
        "run from the image, or remove gms_container."]


def test_every_bad_key_of_gms_container_is_named_with_its_fix():
    _unused, problems = contract_of(gms_container={"image": "Bad Image::x", "archive": "relative.tar",
                                                   "runtime": "kata", "devices": ["gpu0"], "python": "py thon",
                                                   "pull": "always"})
    fields = [p.field for p in problems]
    assert fields == ["gms_container.pull", "gms_container.image", "gms_container.archive", "gms_container.runtime",
                      "gms_container.devices", "gms_container.python"], [str(p) for p in problems]
    assert all(p.fix for p in problems)
    _unused, problems = contract_of(gms_container={"devices": "nvidia.com/gpu=all"})
    assert [p.field for p in problems] == ["gms_container.devices"]  # one string, not a list


def test_an_engine_runs_its_argv_unchanged_in_the_image_in_the_units_cgroup():
    plan = plan_of(gms_container={"runtime": "runc"})
    text = units.engine_dropin(plan, "node1", 1)
    argv = plan.cohort(1).rank_on("node1").process.argv
    exec_line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert exec_line.startswith("ExecStart=/usr/bin/podman --runtime runc run --rm --pull never --device "
                                "nvidia.com/gpu=all --replace --name shadowline-llama-engine-1 --cgroups split "
                                "--network host --ipc host --pid host ")
    assert exec_line.endswith(" nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1 " + " ".join(argv))
    for flag in ("--user shadowline:shadowline", "--cap-drop all", "--security-opt no-new-privileges", "--read-only",
                 "--ulimit host", "--device nvidia.com/gpu=all",
                 "--volume /var/lib/shadowline/models/meta-llama--Llama-3.3-70B-Instruct/"
                 "0123456789abcdef0123456789abcdef01234567:/var/lib/shadowline/llama/model:ro",  # its revision's view
                 "--volume /run/shadowline/llama/gms:/run/shadowline/llama/gms:rw",
                 "--volume /etc/shadowline/llama/secrets:/etc/shadowline/llama/secrets:ro",
                 "--env ENGINE_ID", "--env HOME", "--env ETCD_AUTH_PASSWORD"):
        assert f" {flag} " in exec_line, flag
    assert 'Environment="ENGINE_ID=1"' in text  # values stay in the unit; podman passes them by name
    assert "ExecStopPost=-/usr/bin/podman rm --force --ignore --time 0 shadowline-llama-engine-1" in text
    template = units.engine_template(plan).splitlines()
    assert "Delegate=yes" in template and not any(line.startswith("User=") for line in template)


def test_the_gms_server_and_frontend_run_in_the_image_too():
    plan = plan_of()
    gms = units.gms_unit(plan, "node0")
    assert "ExecStart=/usr/bin/podman run " in gms and "Delegate=yes" in gms
    assert " python3 -m gpu_memory_service.cli.server" in gms
    frontend = units.frontend_unit(plan)
    assert " python3 -m dynamo.frontend " in frontend and "EnvironmentFile=/etc/shadowline/llama/secrets/dynamo.env" in frontend
    assert "--env ETCD_AUTH_PASSWORD" in frontend and "--device" in frontend
    assert container_name("shadowline-llama-engine@3.service") == "shadowline-llama-engine-3"


def test_the_runtime_check_runs_in_a_throwaway_container_of_the_image():
    plan = plan_of()
    argv = runtime_check_argv(plan.container, plan.python, SITE, plan.backend, plan.gpus_per_node)
    assert argv[:10] == ["/usr/bin/podman", "run", "--rm", "--pull", "never", "--device", "nvidia.com/gpu=all",
                         "--network", "none", "--volume"]
    assert argv[10] == f"{SITE}/shadowline:/opt/shadowline-check/shadowline:ro"
    assert argv[11:13] == ["--env", "PYTHONPATH=/opt/shadowline-check"]
    assert argv[13:] == ["nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1", "python3", "-m",
                         "shadowline.deployment.runtime_check", "--backend", "dynamo_vllm", "--gpus", "8"]
    host = runtime_check_argv(None, "/usr/bin/python3", SITE, "standin", 1)
    assert host == ["/usr/bin/python3", "-m", "shadowline.deployment.runtime_check", "--backend", "standin", "--gpus", "1"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is part of systemd")
@pytest.mark.skipif(not os.path.exists("/usr/bin/podman"), reason="podman: bindep.txt, scripts/setup-system")
def test_every_container_unit_passes_systemd_analyze_verify(tmp_path: Path):
    plan = plan_of(gms_service_user="root")
    files = {plan.unit_name("gms"): units.gms_unit(plan, "node0"), plan.unit_name("frontend"): units.frontend_unit(plan),
             plan.unit_name("engine"): units.engine_template(plan)}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    dropin = tmp_path / f"{plan.unit_name('engine', 1)}.d"
    dropin.mkdir()
    (dropin / "plan.conf").write_text(units.engine_dropin(plan, "node1", 1))
    names = [n for n in files if "@" not in n] + [plan.unit_name("engine", 1)]
    result = subprocess.run(["systemd-analyze", "verify", *names], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"}, check=False)
    assert result.returncode == 0, result.stderr


def image_problems(image_facts: dict | None, **container) -> list[str]:
    from shadowline.deployment.preflight import run_preflight  # noqa: PLC0415 (only these tests)
    hv, hosts = hostvars(1, gms_engine={"tensor_parallel_size": 8}, **({"gms_container": container} if container else {}))
    hv["node0"]["python_env_mode"] = "container"
    facts = {"listening": [], "gpus": None, "python": None, "manifest_weight_bytes": None, "lock_dir": None,
             "runtime_mode": "container", "image": image_facts}
    return [str(p) for p in run_preflight(hv, hosts, [], {"node0": facts}).problems]


def test_preflight_refuses_an_image_the_node_lacks_and_cannot_pull_before_anything_changes():
    unreachable = {"image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1", "podman": True, "present": False,
                   "pullable": False, "error": 'Error: reading image "docker://nvcr.io/...": pinging container '
                   'registry nvcr.io: no such host'}
    (msg,) = image_problems(unreachable)
    assert msg.startswith("gms_container.image (host node0): nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1 is not on "
                          "this node and cannot be pulled: Error: reading image")
    assert "Fix: log in to the registry as root (podman login)" in msg
    assert image_problems({**unreachable, "present": True, "pullable": None, "error": None}) == []
    assert image_problems({**unreachable, "pullable": True, "error": None}) == []
    assert image_problems({**unreachable, "podman": False, "present": None, "pullable": None, "error": None}) == []
    (msg,) = image_problems(None, archive="/nonexistent/image.tar")
    assert msg == ("gms_container.archive: /nonexistent/image.tar is not a file on the controller. Fix: build it "
                   "(make standin-image for the stand-in; podman save -o FILE IMAGE for another image), or leave "
                   "gms_container.archive empty to pull the image.")


@pytest.mark.skipif(not os.path.exists("/usr/bin/podman"), reason="podman: bindep.txt, scripts/setup-system")
def test_the_node_fact_asks_podman_for_the_image_and_its_registry():
    from shadowline.deployment.node_facts import image_facts  # noqa: PLC0415 (only this test)
    facts = image_facts({"image": "localhost:1/shadowline/never-built:0"}, "standin")
    assert (facts["podman"], facts["present"], facts["pullable"]) == (True, False, False), facts
    assert "localhost:1" in facts["error"], facts
    assert image_facts({"image": "localhost:1/x:0", "archive": "/tmp/x.tar"}, "standin")["pullable"] is None
