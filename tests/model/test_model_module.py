"""The shadowline.gms.model_stage module run through ansible-playbook on localhost:
check mode, real run, diff, idempotence, repair, refusal, removal, and the hf:// path."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from modelkit import REV

from shadowline.model.manifest import MANIFEST_NAME

MODULE = "shadowline.gms.model_stage"


def test_module_lifecycle_through_ansible(run_playbook, inventory):
    local = Path(inventory["local_dir"])
    args = {"model": dict(inventory, served_name="extra keys of gms_model are ignored"), "verify": "fast"}
    shard = str(local / "model-00002-of-00003.safetensors")
    run = run_playbook(
        [
            ("check", {MODULE: args, "check_mode": True, "diff": True}),
            ("after_check", {"ansible.builtin.stat": {"path": str(local.parent)}}),
            ("real", {MODULE: args, "diff": True}),
            ("status_file", {"ansible.builtin.slurp": {"src": "{{ r_real.status_path }}"}}),
            ("check_again", {MODULE: args, "check_mode": True, "diff": True}),
            ("rerun", {MODULE: args}),
            ("damage", {"ansible.builtin.copy": {"content": "damaged", "dest": shard}}),
            ("repair", {MODULE: args, "diff": True}),
            ("unpinned", {MODULE: {"model": dict(inventory, revision="main")}, "ignore_errors": True}),
            ("no_local_dir", {MODULE: {"model": {"id": "acme/x", "revision": REV}}, "ignore_errors": True}),
            ("absent", {MODULE: dict(args, state="absent")}),
        ]
    )
    assert run.rc == 0, run.stdout[-3000:] + run.stderr[-3000:]
    r = run.result

    check = r["check"]
    assert check["changed"] is True and check["status"] == "Pending" and check["files"] == 7
    assert r["after_check"]["stat"]["exists"] is False, "check mode must not create anything"
    assert "-(no model staged)" in run.stdout and "+digest: (computed after staging)" in run.stdout

    real = r["real"]
    assert real["changed"] is True and real["status"] == "Ready" and real["revision"] == REV
    assert real["digest"].startswith("sha256:") and real["files"] == 7 and real["total_bytes"] > 0
    assert f"+digest: {real['digest']}" in run.stdout
    assert "+  model-00001-of-00003.safetensors" in run.stdout
    status = json.loads(base64.b64decode(r["status_file"]["content"]))
    assert status["state"] == "Ready" and status["digest"] == real["digest"] and status["revision"] == REV

    assert r["check_again"]["changed"] is False and r["check_again"]["hashed_bytes"] == 0
    assert r["rerun"]["changed"] is False and r["rerun"]["status"] == "Ready" and r["rerun"]["hashed_bytes"] == 0

    repair = r["repair"]
    assert repair["changed"] is True and repair["repaired"] == ["model-00002-of-00003.safetensors"]
    assert repair["digest"] == real["digest"]

    unpinned = r["unpinned"]
    assert unpinned["failed"] is True and unpinned["field"] == "gms_model.revision"
    assert "gms_model_allow_unpinned" in unpinned["msg"]
    assert r["no_local_dir"]["failed"] is True and r["no_local_dir"]["field"] == "gms_model.local_dir"

    assert r["absent"]["changed"] is True and not local.exists()


def test_module_hf_source_with_token_file(run_playbook, fake_hub, tmp_path: Path, token_file: Path):
    local = tmp_path / "hfnode" / "m"
    model = {"id": fake_hub.repo, "revision": REV, "local_dir": str(local)}
    env = {"HF_ENDPOINT": fake_hub.endpoint, "HF_HOME": str(tmp_path / "hf-home-ansible"), "NO_PROXY": "127.0.0.1"}
    run = run_playbook([("hf", {MODULE: {"model": model, "hf_token_file": str(token_file)}, "diff": True})], env=env)
    assert run.rc == 0, run.stdout[-3000:] + run.stderr[-3000:]
    res = run.result["hf"]
    assert res["status"] == "Ready" and res["files"] == 7
    assert (local / MANIFEST_NAME).exists()
    assert fake_hub.token not in run.stdout + run.stderr + json.dumps(run.result)
    assert fake_hub.downloads() and all(auth == f"Bearer {fake_hub.token}" for _unused1, _unused2, auth in fake_hub.requests)
