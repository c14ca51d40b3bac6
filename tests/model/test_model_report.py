"""What the model_cache role and the engine gate show and rely on, without hosts: the report table and progress
lines, results trimmed into facts, the filters (readiness over slurped status files, defaults), the engines'
model drop-in, staged files readable by the service user whatever the umask, and the token file's path kept out
of the world-readable status file."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from modelkit import MODEL_ID, REV, REV2, make_model

from shadowline.deployment import units
from shadowline.model.report import progress_line, status_table, trim_result
from shadowline.model.spec import spec_from_inventory
from shadowline.model.stage import ensure_model
from shadowline.model.status import read_status

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def filters():
    """plugins/filter/model.py, imported as Ansible loads it (through ansible_collections)."""
    pytest.importorskip("ansible")
    collections = REPO / "collections"
    if not (collections / "ansible_collections" / "shadowline" / "gms").exists():
        pytest.skip("collections/ansible_collections/shadowline/gms is missing (make setup)")
    sys.path.insert(0, str(collections))
    try:
        from ansible_collections.shadowline.gms.plugins.filter import model
    finally:
        sys.path.remove(str(collections))
    return model.FilterModule().filters()


def ready(host: str, digest: str = "sha256:" + "a" * 64, revision: str = REV) -> dict:
    return {"host": host, "status": "Ready", "changed": False, "model_id": MODEL_ID, "revision": revision,
            "digest": digest, "files": 7, "total_bytes": 6 << 20, "verify_seconds": 0.0004, "hashed_bytes": 0}


def slurped(status: dict) -> dict:
    return {"content": base64.b64encode(json.dumps(status).encode()).decode(), "encoding": "base64",
            "source": "/x", "changed": False}


def test_table_says_what_each_node_did_and_whether_all_agree():
    staged = dict(ready("node1"), changed=True, fetched_bytes=6 << 20, fetch_seconds=0.5)
    failed = trim_result({"status": "Failed", "msg": "rsync listing failed. Fix: check the host.",
                          "field": "gms_model.source", "failed": False}, "node2")  # failed_when: false hid it
    text = status_table([ready("node0"), staged, failed])
    lines = text.splitlines()
    assert lines[0].split() == ["node", "status", "revision", "digest", "files", "size", "last", "run"]
    assert "verified in 0.4 ms (0 B hashed)" in lines[2]
    assert "staged: fetched 6.0 MiB in 500 ms, 12.0 MiB/s" in lines[3]
    assert "FAILED gms_model.source: rsync listing failed." in lines[4] and failed["failed"] is True
    assert lines[-1] == f"{MODEL_ID}@{REV[:12]}: 2 of 3 node(s) Ready, 1 distinct digest(s)"
    assert status_table([ready("a"), ready("b")]).splitlines()[-1].endswith("Ready with digest sha256:" + "a" * 64)


def test_results_without_a_module_result_become_failures_with_the_fix():
    died = trim_result({"cmd": "/x/AnsiballZ", "data": "", "stderr": "Killed", "msg": "Traceback ...",
                        "finished": 1}, "node1")
    assert died["status"] == "Failed" and died["msg"].startswith("the staging process died without a result")
    assert died["msg"].endswith("Re-run to resume: files already fetched are kept.") and "Traceback" not in died["msg"]
    late = trim_result({"finished": 0, "started": 1, "ansible_job_id": "1.2"}, "node2")
    assert late["status"] == "Failed" and "model_cache_timeout_s" in late["msg"]
    kept = trim_result(dict(ready("x"), invocation={"module_args": {"hf_token_file": "/secret"}}, diff={}), "node0")
    assert "invocation" not in kept and "diff" not in kept and kept["host"] == "node0"


def test_progress_lines():
    status = {"state": "Downloading", "progress": {"text": "download: 1.0 MiB / 4.0 MiB (25.0%), 0/4 files"}}
    assert progress_line("running\n" + json.dumps(status)) == "Downloading: download: 1.0 MiB / 4.0 MiB (25.0%), 0/4 files"
    assert progress_line("finished\n" + json.dumps({"state": "Ready"})) == "finished (Ready)"
    assert progress_line("running\n" + json.dumps({"state": "Ready"})) == "Ready, finishing"
    assert progress_line("running\n") == "starting"


def test_readiness_filter_reads_slurped_status_files(filters):
    gate = filters["model_readiness"]
    other = "sha256:" + "b" * 64
    statuses = {
        "node0": slurped({**ready("node0"), "state": "Ready"}),
        "node1": slurped({**ready("node1", other), "state": "Ready"}),
        "node2": slurped({**ready("node2"), "state": "Ready"}),
        "node3": {"failed": True, "msg": "file not found: /var/lib/...status.json"},  # a slurp that found nothing
    }
    problems = gate(statuses, expected_revision=REV, expected_model_id=MODEL_ID)
    assert problems == [
        "node3: no model status (status file missing or unreadable); stage the model on it.",
        "node1: manifest digest sha256:bbbbbbbbbbbb… differs from sha256:aaaaaaaaaaaa… held by node0, node2; "
        "restage node1.",
    ]
    assert gate([ready("a"), ready("b")], expected_revision=REV) == []
    # a branch (gms_model_allow_unpinned) is not compared with the commit the nodes hold; they agree
    assert gate([ready("a", revision=REV2), ready("b", revision=REV2)], expected_revision="main") == []
    assert filters["model_status"](statuses["node1"])["digest"] == other and filters["model_status"](None) == {}


def test_model_defaults_and_the_engine_drop_in(filters):
    model = filters["model_effective"]({"id": "meta-llama/Llama-3.3-70B-Instruct", "revision": REV})
    assert model["local_dir"] == f"/var/lib/shadowline/models/meta-llama--Llama-3.3-70B-Instruct/{REV}"
    assert filters["model_effective"]({"id": "a/b", "revision": REV, "local_dir": "/m/x"})["local_dir"] == "/m/x"
    assert filters["model_status_path"]("/m/x") == "/m/.shadowline-model-x.status.json"
    digest = "sha256:" + "c" * 64
    assert units.engine_model_dropin(digest) == f'[Service]\nEnvironment="SHADOWLINE_MODEL_DIGEST={digest}"\n'
    assert filters["model_dropin"](digest) == units.engine_model_dropin(digest)


def test_staged_model_is_readable_by_the_service_user_whatever_the_umask(tmp_path: Path):
    source = make_model(tmp_path / "src")
    for path in source.iterdir():
        path.chmod(0o600)  # as safetensors.save_file writes them
    local = tmp_path / "a" / "b" / "models" / "tiny"
    old = os.umask(0o077)
    try:
        result = ensure_model(spec_from_inventory(
            {"id": MODEL_ID, "revision": REV, "source": f"file://{source}", "local_dir": str(local)}))
    finally:
        os.umask(old)
    assert result.state == "Ready"
    for path in [local, local.parent, local.parent.parent, *local.iterdir()]:
        want = 0o755 if path.is_dir() else 0o644
        assert stat.S_IMODE(path.stat().st_mode) == want, path
    again = ensure_model(spec_from_inventory(
        {"id": MODEL_ID, "revision": REV, "source": f"file://{source}", "local_dir": str(local)}))
    assert again.changed is False and again.hashed_bytes == 0  # modes were set before the stat keys were recorded


def test_the_token_files_path_stays_out_of_the_status_file(tmp_path: Path):
    token_file = tmp_path / "very-secret-location" / "hf-token"
    local = tmp_path / "models" / "m"
    spec = spec_from_inventory({"id": MODEL_ID, "revision": REV, "source": f"hf://{MODEL_ID}",
                                "local_dir": str(local)}, hf_token_file=str(token_file))
    with pytest.raises(Exception) as err:
        ensure_model(spec)
    assert str(token_file) in str(err.value)  # the module's no_log masks it in Ansible's output
    status = read_status(spec.status_path)
    assert status is not None and status.state == "Failed"
    assert "very-secret-location" not in Path(spec.status_path).read_text() and "***" in (status.error or "")
