"""Teardown removes only what the deployment can prove it created (issue #42), on a temporary directory: the marker
logic of shadowline.gms.install_files (``directories`` with ``mark``, ``owned_absent``), run as Ansible runs a
module, and the deployment's directories it is given (deployment/directories.py: the base role and teardown.yml).
The testbed proof (sentinels beside and above every user-given path) is tests/e2e/test_site.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shadowline.deployment.contract import default_socket_dir, parse_contract
from shadowline.deployment.directories import (
    MARKER,
    deployment_directories,
    removable_directories,
    tmpfiles_text,
)
from shadowline.deployment.plan_builder import build_plan
from shadowline.model.policy import MANIFEST_NAME

from .helpers import hostvars

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "plugins" / "modules" / "install_files.py"
ME = {"owner": str(os.getuid()), "group": str(os.getgid())}


def module(tmp_path: Path, check_mode: bool = False, **args) -> dict:
    """The module with these arguments, in a subprocess (AnsibleModule reads them from a file); failed or not."""
    pytest.importorskip("ansible")
    spec = tmp_path / "args.json"
    spec.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check_mode,
                                                        "_ansible_diff": True}}))
    proc = subprocess.run([sys.executable, str(MODULE), str(spec)], capture_output=True, text=True, check=False)
    return json.loads(proc.stdout)


def ok(tmp_path: Path, check_mode: bool = False, **args) -> dict:
    result = module(tmp_path, check_mode, **args)
    assert not result.get("failed"), result
    return result


def sentinel(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not shadowline's\n")
    return path


def test_a_directory_made_here_is_marked_and_one_already_there_is_not(tmp_path: Path) -> None:
    made, there = tmp_path / "made" / "gms", sentinel(tmp_path / "there" / "user.txt").parent
    wanted = {"owner": "demo", "directories": [{"path": str(made), "mode": "0750", "mark": True, **ME},
                                               {"path": str(there), "mark": True, **ME}]}
    first = ok(tmp_path, **wanted)
    assert (made / MARKER).read_text() == "demo\n" and not (there / MARKER).exists()
    assert first["owned"] == [str(made)] and first["changed_paths"] == [str(made)]
    again = ok(tmp_path, **wanted)
    assert (again["changed"], again["owned"]) == (False, [str(made)])
    check = ok(tmp_path, check_mode=True, owner="demo", directories=[{"path": str(tmp_path / "new"), "mark": True}])
    assert check["owned"] == [str(tmp_path / "new")] and not (tmp_path / "new").exists()


def test_a_directory_of_another_deployment_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "shared"
    ok(tmp_path, owner="other", directories=[{"path": str(other), "mark": True}])
    result = module(tmp_path, owner="demo", directories=[{"path": str(other), "mark": True}])
    assert result.get("failed") and "holds the marker of 'other', not demo" in result["msg"], result


def test_owned_absent_removes_only_a_directory_with_the_owners_marker(tmp_path: Path) -> None:
    ours = tmp_path / "ours"
    ok(tmp_path, owner="demo", directories=[{"path": str(ours), "mark": True}])
    sentinel(ours / "state" / "events.jsonl")
    user = sentinel(tmp_path / "user" / "keep.txt").parent
    other = tmp_path / "other"
    ok(tmp_path, owner="other", directories=[{"path": str(other), "mark": True}])
    link = tmp_path / "link"
    link.symlink_to(ours)
    plain = sentinel(tmp_path / "a-file")
    forged = sentinel(tmp_path / "forged" / "keep.txt").parent
    (forged / MARKER).symlink_to(ours / MARKER)  # a marker that is a link proves nothing

    entries = [{"path": str(p)} for p in (link, user, other, plain, forged, ours, tmp_path / "missing")]
    check = ok(tmp_path, check_mode=True, owner="demo", owned_absent=entries)
    assert check["changed_paths"] == [str(ours)] and ours.is_dir()
    assert check["diff"] == [{"before_header": str(ours), "after_header": str(ours),
                              "before": {"state": "directory", "owner": "demo"}, "after": {"state": "absent"}}]
    result = ok(tmp_path, owner="demo", owned_absent=entries)
    assert result["changed_paths"] == [str(ours)] and not ours.exists()
    assert {k["path"]: k["reason"] for k in result["kept"]} == {
        str(link): "is a symbolic link",
        str(user): f"holds no {MARKER} (demo did not create it)",
        str(other): f"has a {MARKER} naming 'other', not demo",
        str(plain): "is not a directory",
        str(forged): f"holds no {MARKER} (demo did not create it)",
    }
    assert all(p.exists() for p in (user / "keep.txt", other / MARKER, plain, forged / "keep.txt"))
    assert f"kept {user}: it holds no {MARKER}" in json.dumps(result.get("warnings")), result  # said, not only returned
    assert module(tmp_path, owner="demo", owned_absent=[{"path": "/"}])["msg"] == "owned_absent: refusing to remove /"


def manifest(directory: Path, model_id: str) -> Path:
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(b"weights")
    (directory / MANIFEST_NAME).write_text(json.dumps({"schema": 1, "model_id": model_id, "revision": "r"}))
    return directory


def test_a_model_directory_is_removed_only_with_shadowlines_manifest_of_that_model(tmp_path: Path) -> None:
    staged = manifest(tmp_path / "models" / "llama", "org/llama")
    other = manifest(tmp_path / "models" / "mistral", "org/mistral")
    etc = sentinel(tmp_path / "etc" / "passwd").parent  # local_dir: /etc passed preflight once
    broken = sentinel(tmp_path / "broken" / MANIFEST_NAME).parent
    beside = sentinel(tmp_path / "models" / "notes.txt")

    def entry(path: Path) -> dict:
        return {"path": str(path), "marker": MANIFEST_NAME, "key": "model_id", "owner": "org/llama"}

    result = ok(tmp_path, owned_absent=[entry(p) for p in (etc, broken, other, staged)])
    assert result["changed_paths"] == [str(staged)] and not staged.exists()
    assert {k["path"]: k["reason"] for k in result["kept"]} == {
        str(etc): f"holds no {MANIFEST_NAME} (org/llama did not create it)",
        str(broken): f"has a {MANIFEST_NAME} that is not JSON",
        str(other): f"has a {MANIFEST_NAME} naming 'org/mistral', not org/llama",
    }
    assert (etc / "passwd").exists() and (other / "model.safetensors").exists() and beside.exists()


def plan_of(tmp_path: Path, **shared):
    hv, hosts = hostvars(1, **shared)
    contract, problems = parse_contract(hv, hosts)
    assert not problems, problems
    return build_plan(contract, state_dir=str(tmp_path / "state" / "demo"), config_dir=str(tmp_path / "etc" / "demo"))


def as_me(entries: list[dict]) -> list[dict]:
    return [{**e, **ME} for e in entries]


def test_teardown_keeps_the_parent_of_a_user_given_socket_dir_and_what_is_beside_it(tmp_path: Path) -> None:
    """Issue #42: gms_socket_dir /tmp/victim/gms made teardown remove /tmp/victim and a file beside gms in it."""
    victim = tmp_path / "victim"
    beside = sentinel(victim / "unrelated.txt")
    above = sentinel(tmp_path / "above.txt")
    plan = plan_of(tmp_path, gms_socket_dir=str(victim / "gms"))
    dirs = deployment_directories(plan)
    assert [d["path"] for d in dirs] == [plan.config_dir, plan.state_dir, str(victim / "gms")]  # not the parent
    victim.chmod(0o700)
    made = ok(tmp_path, owner=plan.deployment, directories=as_me(dirs))
    assert made["owned"] == [plan.config_dir, plan.state_dir, str(victim / "gms")]
    assert oct(victim.stat().st_mode & 0o777) == "0o700"  # the user's: not even its mode changed
    text = tmpfiles_text(plan, made["owned"])
    assert f"d {victim} " not in text and f"f {victim}/gms/{MARKER} 0644 root root - llama" in text

    removed = ok(tmp_path, owner=plan.deployment, owned_absent=removable_directories(plan, models=True))
    assert sorted(removed["changed_paths"]) == sorted([plan.config_dir, plan.state_dir, str(victim / "gms")])
    assert beside.read_text() == "not shadowline's\n" and above.exists() and victim.is_dir()
    assert removed["kept"] == []  # the model's directory is not there: nothing to say


def test_a_socket_dir_that_was_there_before_is_kept_with_what_is_in_it(tmp_path: Path) -> None:
    existing = sentinel(tmp_path / "sockets" / "gms" / "user.sock").parent
    plan = plan_of(tmp_path, gms_socket_dir=str(existing))
    made = ok(tmp_path, owner=plan.deployment, directories=as_me(deployment_directories(plan)))
    assert str(existing) not in made["owned"] and f"{existing}/{MARKER}" not in tmpfiles_text(plan, made["owned"])
    removed = ok(tmp_path, owner=plan.deployment, owned_absent=removable_directories(plan))
    assert (existing / "user.sock").exists()
    assert removed["kept"] == [{"path": str(existing), "reason": f"holds no {MARKER} (llama did not create it)"}]


def test_the_default_socket_dirs_parent_is_the_deployments_own() -> None:
    hv, hosts = hostvars(1)
    plan = build_plan(parse_contract(hv, hosts)[0])
    assert plan.socket_dir == default_socket_dir("llama")
    assert removable_directories(plan) == [{"path": "/etc/shadowline/llama"}, {"path": "/var/lib/shadowline/llama"},
                                           {"path": "/run/shadowline/llama"}, {"path": "/run/shadowline/llama/gms"}]
    assert removable_directories(plan, models=True)[-1] == {
        "path": plan.model_dir, "marker": MANIFEST_NAME, "key": "model_id", "owner": "meta-llama/Llama-3.3-70B-Instruct"}
    text = tmpfiles_text(plan, ["/run/shadowline/llama", "/run/shadowline/llama/gms"])
    assert text.splitlines()[1:] == [
        "d /run/shadowline/llama 0755 root root -",
        f"f /run/shadowline/llama/{MARKER} 0644 root root - llama",
        "d /run/shadowline/llama/gms 0750 shadowline shadowline -",
        f"f /run/shadowline/llama/gms/{MARKER} 0644 root root - llama",
    ]
