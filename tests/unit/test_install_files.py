"""shadowline.gms.install_files (plugins/modules/install_files.py), run as Ansible runs a module, and the engine
role's filters that feed it (engine_files, engine_changed_cohorts in plugins/filter/cohorts.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan_builder import build_plan

from .helpers import hostvars

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "plugins" / "modules" / "install_files.py"
ME = {"owner": str(os.getuid()), "group": str(os.getgid())}


def run(tmp_path: Path, check_mode: bool = False, **args) -> dict:
    """The module with these arguments, in a subprocess (AnsibleModule reads them from a file)."""
    pytest.importorskip("ansible")
    spec = tmp_path / "args.json"
    spec.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check_mode,
                                                        "_ansible_diff": True}}))
    proc = subprocess.run([sys.executable, str(MODULE), str(spec)], capture_output=True, text=True, check=False)
    result = json.loads(proc.stdout)
    assert not result.get("failed"), result
    return result


def mode(path: Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


def test_creates_then_changes_nothing_then_only_what_differs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    wanted = {"directories": [{"path": str(root / "a" / "b"), "mode": "0750", **ME}],
              "files": [{"path": str(root / "a" / "b" / "x.conf"), "content": "x\n", "mode": "0640", **ME},
                        {"path": str(root / "a" / "y.conf"), "content": "y\n", "mode": "0644", **ME}]}
    first = run(tmp_path, **wanted)
    assert first["changed"] and first["changed_paths"] == [str(root / "a" / "b"), str(root / "a" / "b" / "x.conf"),
                                                           str(root / "a" / "y.conf")]
    assert (root / "a" / "b" / "x.conf").read_text() == "x\n" and mode(root / "a" / "b" / "x.conf") == "0o640"
    assert mode(root / "a" / "b") == "0o750" and mode(root / "a") == "0o755"  # a missing parent, as mkdir -p
    again = run(tmp_path, **wanted)
    assert (again["changed"], again["changed_paths"], again["diff"]) == (False, [], [])

    wanted["files"][1]["content"] = "y2\n"
    (root / "a" / "b").chmod(0o700)
    second = run(tmp_path, **wanted)
    assert second["changed_paths"] == [str(root / "a" / "b"), str(root / "a" / "y.conf")]
    assert (root / "a" / "y.conf").read_text() == "y2\n" and mode(root / "a" / "b") == "0o750"
    assert [d["after"] for d in second["diff"]] == ["y2\n"]
    assert not list((root / "a").glob(".y.conf.*")), "a temporary file is left"


def test_check_mode_changes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "d"
    result = run(tmp_path, check_mode=True, directories=[{"path": str(target), **ME}],
                 files=[{"path": str(target / "f"), "content": "f", **ME}], absent=[str(tmp_path / "args.json")])
    assert result["changed_paths"] == [str(tmp_path / "args.json"), str(target), str(target / "f")]
    assert not target.exists() and (tmp_path / "args.json").exists()


def test_absent_removes_files_and_trees(tmp_path: Path) -> None:
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "f").write_text("f")
    (tmp_path / "file").write_text("f")
    gone = [str(tmp_path / "tree"), str(tmp_path / "file"), str(tmp_path / "never")]
    assert run(tmp_path, absent=gone)["changed_paths"] == gone[:2]
    assert not (tmp_path / "tree").exists() and not (tmp_path / "file").exists()
    assert run(tmp_path, absent=gone)["changed"] is False


@pytest.fixture(scope="module")
def filters() -> dict:
    """plugins/filter/cohorts.py, imported as Ansible loads it: through collections/ (a link `make setup` makes)."""
    sys.path.insert(0, str(REPO / "collections"))
    try:
        cohorts = pytest.importorskip("ansible_collections.shadowline.gms.plugins.filter.cohorts")
    finally:
        sys.path.remove(str(REPO / "collections"))
    return cohorts.FilterModule().filters()


def test_engine_files_and_the_cohorts_they_change(filters: dict) -> None:
    hv, hosts = hostvars(2, gms_cohorts=3, gms_engine={"tensor_parallel_size": 16})
    contract, problems = parse_contract(hv, hosts)
    assert not problems
    plan = build_plan(contract).to_dict()
    files = filters["engine_files"](plan, "node1", "sha256:" + "a" * 64)
    template = "/etc/systemd/system/shadowline-llama-engine@.service"
    dropin = "/etc/systemd/system/shadowline-llama-engine@{}.service.d"
    assert [f["path"] for f in files["files"]] == [template] + [
        f"{dropin.format(c)}/{name}" for c in range(3) for name in ("plan.conf", "model.conf")]
    assert [d["path"] for d in files["directories"]] == ["/var/lib/shadowline/llama/model"] + [
        p for c in range(3) for p in (f"/var/lib/shadowline/llama/engines/{c}", dropin.format(c))]
    revision = build_plan(contract).model_dir
    assert (f"BindReadOnlyPaths={revision}:/var/lib/shadowline/llama/model" in files["files"][1]["content"]
            and " --model /var/lib/shadowline/llama/model " in files["files"][1]["content"]), "the model's one view"
    assert "--node-rank 1" in files["files"][1]["content"] and "SHADOWLINE_MODEL_DIGEST" in files["files"][2]["content"]
    assert len(filters["engine_files"](plan, "node1", "")["files"]) == 4  # no model.conf before the gate passed

    changed = filters["engine_changed_cohorts"]
    assert changed(plan, []) == [] and changed(plan, [dropin.format(1)]) == []  # a new directory alone
    assert changed(plan, [f"{dropin.format(2)}/model.conf", "/var/lib/shadowline/llama/engines/0"]) == [2]
    assert changed(plan, [template]) == [0, 1, 2]
    # upgrade.yml's writer cohort alone: only its drop-ins are written, only it counts as changed
    writer = filters["engine_files"](plan, "node1", "sha256:" + "a" * 64, [0])
    assert [f["path"] for f in writer["files"]] == [template, f"{dropin.format(0)}/plan.conf",
                                                    f"{dropin.format(0)}/model.conf"]
    assert changed(plan, [template, f"{dropin.format(2)}/plan.conf"], [0]) == [0]
    assert changed(plan, [f"{dropin.format(2)}/plan.conf"], [0]) == []


def test_the_serving_cohort_and_the_cohorts_not_on_the_plans_command(filters: dict) -> None:
    """playbooks/upgrade.yml's two filters: who holds the lock, and whose running command is not the plan's."""
    hv, hosts = hostvars(2, gms_cohorts=3, gms_engine={"tensor_parallel_size": 16})
    contract, _problems = parse_contract(hv, hosts)
    plan = build_plan(contract).to_dict()
    serving = filters["serving_cohort"]
    assert (serving(plan, "engine-2\n"), serving(plan, ""), serving(plan, "engine-7"), serving(plan, "x")) == (2, -1, -1, -1)
    argv = {c["cohort"]: next(r for r in c["ranks"] if r["host"] == "node1")["process"]["argv"] for c in plan["cohorts"]}
    running = [{"item": {"cohort": 0}, "stdout_lines": argv[0]},
               {"item": {"cohort": 1}, "stdout_lines": argv[1][:-1]},  # an older command
               {"item": {"cohort": 2}, "stdout_lines": []}]  # not running
    assert filters["stale_cohorts"](plan, "node1", running) == [1, 2]
    # the same command on another model revision: every revision's engines name one model path, so the rank's
    # GMS_SOCKET_DIR (its revision's residency) tells them apart
    residency = next(r for r in plan["cohorts"][0]["ranks"] if r["host"] == "node1")["process"]["env"]["GMS_SOCKET_DIR"]
    now = [*argv[0], "--environment--", f"GMS_SOCKET_DIR={residency}"]
    old = [*argv[0], "--environment--", "GMS_SOCKET_DIR=/run/shadowline/llama/gms/rev-ffffffffffff"]
    assert filters["stale_cohorts"](plan, "node1", [{"item": {"cohort": 0}, "stdout_lines": now}]) == []
    assert filters["stale_cohorts"](plan, "node1", [{"item": {"cohort": 0}, "stdout_lines": old}]) == [0]

    # container mode: the unit's main process is `podman run ... IMAGE argv`; a rank runs the plan when it ends with
    # the image and the plan's argv
    hv, hosts = hostvars(2, gms_cohorts=2, gms_engine={"tensor_parallel_size": 16})
    for host in hosts:
        hv[host]["python_env_mode"] = "container"
    contract, _problems = parse_contract(hv, hosts)
    plan = build_plan(contract).to_dict()
    argv = {c["cohort"]: next(r for r in c["ranks"] if r["host"] == "node1")["process"]["argv"] for c in plan["cohorts"]}
    podman = ["/usr/bin/podman", "run", "--rm", "--name", "x"]
    image = plan["container"]["image"]
    running = [{"item": {"cohort": 0}, "stdout_lines": [*podman, image, *argv[0]]},
               {"item": {"cohort": 1}, "stdout_lines": [*podman, "other/image:1", *argv[1]]}]  # the old image
    assert filters["stale_cohorts"](plan, "node1", running) == [1]
    assert filters["stale_cohorts"](plan, "node1", [{"item": {"cohort": 0}, "stdout_lines": argv[0]}]) == [0]


def test_the_gms_servers_of_other_revisions_are_the_ones_to_retire() -> None:
    """gms_units_unplanned: the GMS units found of another residency than the plan's, and the unit of a deployment
    from before residencies; never the plan's own, another deployment's or the template's name."""
    sys.path.insert(0, str(REPO / "collections"))
    try:
        installed = pytest.importorskip("ansible_collections.shadowline.gms.plugins.filter.installed_units")
    finally:
        sys.path.remove(str(REPO / "collections"))
    hv, hosts = hostvars(2)
    plan = build_plan(parse_contract(hv, hosts)[0])
    unit_dir = "/etc/systemd/system"
    found = [f"{unit_dir}/{plan.unit_name('gms')}", f"{unit_dir}/shadowline-llama-gms@ffffffffffff.service",
             f"{unit_dir}/shadowline-llama-gms.service", f"{unit_dir}/shadowline-llama-gms@.service",
             f"{unit_dir}/shadowline-other-gms@ffffffffffff.service"]
    assert installed.gms_units_unplanned(plan.to_dict(), found) == [
        {"unit": "shadowline-llama-gms.service", "path": f"{unit_dir}/shadowline-llama-gms.service", "socket_dir": None},
        {"unit": "shadowline-llama-gms@ffffffffffff.service", "path": f"{unit_dir}/shadowline-llama-gms@ffffffffffff.service",
         "socket_dir": f"{plan.socket_dir}/rev-ffffffffffff"}]


def test_a_replicas_plan_from_the_playbooks_replica_variable(filters: dict) -> None:
    """replica_plan takes ``-e replica`` as a playbook has it: "" (none given) is replica 0, a number as text
    its replica; a replica the deployment lacks is refused naming those there are."""
    from .test_replicas import fleet_plan  # noqa: PLC0415 (the 2-replica fleet of that file)

    plan = fleet_plan().to_dict()
    replica_plan = filters["replica_plan"]
    assert replica_plan(plan, "") == replica_plan(plan, 0) == replica_plan(plan, "0")
    assert [n["host"] for n in replica_plan(plan, "1")["nodes"]] == ["node2", "node3"]
    with pytest.raises(KeyError, match="0, 1"):
        replica_plan(plan, 2)
