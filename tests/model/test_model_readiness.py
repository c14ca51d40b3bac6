"""readiness_gate: every node Ready with the same digest and revision, or a named problem."""

from __future__ import annotations

from modelkit import MODEL_ID, REV, REV2

from shadowline.model.readiness import readiness_gate
from shadowline.model.status import ModelStatus

D1 = "sha256:" + "a" * 64
D2 = "sha256:" + "b" * 64


def ready(digest: str = D1, revision: str = REV, model_id: str = MODEL_ID) -> ModelStatus:
    return ModelStatus(state="Ready", model_id=model_id, revision=revision, local_dir="/m", digest=digest)


def test_all_ready_and_identical_passes():
    assert readiness_gate({"n1": ready(), "n2": ready(), "n3": ready()}, expected_revision=REV) == []


def test_different_digest_refused_and_host_named():
    problems = readiness_gate({"n1": ready(), "n2": ready(), "n3": ready(D2)})
    assert len(problems) == 1
    assert problems[0].startswith("n3: manifest digest sha256:bbbbbbbbbbbb")
    assert "n1, n2" in problems[0]


def test_different_revision_refused():
    problems = readiness_gate({"n1": ready(), "n2": ready(revision=REV2, digest=D2)})
    assert any("revision" in p for p in problems)
    problems = readiness_gate({"n1": ready(), "n2": ready()}, expected_revision=REV2)
    assert problems == [
        f"n1: holds revision {REV}, the pinned revision is {REV2}.",
        f"n2: holds revision {REV}, the pinned revision is {REV2}.",
    ]


def test_not_ready_nodes_refused_with_detail():
    downloading = ModelStatus(
        state="Downloading",
        model_id=MODEL_ID,
        revision=REV,
        local_dir="/m",
        progress={"text": "download: 1.0 GiB / 4.0 GiB"},
    )
    failed = {"state": "Failed", "model_id": MODEL_ID, "revision": REV, "error": "no space"}
    problems = readiness_gate({"n1": ready(), "n2": downloading, "n3": failed, "n4": None})
    assert problems[0] == "n2: model is Downloading, not Ready (download: 1.0 GiB / 4.0 GiB)."
    assert problems[1] == "n3: model is Failed, not Ready: no space."
    assert problems[2].startswith("n4: no model status")


def test_accepts_module_results_and_status_dicts():
    module_result = {"status": "Ready", "model_id": MODEL_ID, "revision": REV, "digest": D1, "changed": False}
    status_file = ready().as_dict()
    assert readiness_gate({"n1": module_result, "n2": status_file}) == []


def test_empty_and_wrong_model():
    assert readiness_gate({})
    problems = readiness_gate({"n1": ready(model_id="other/model")}, expected_model_id=MODEL_ID)
    assert problems == [f"n1: holds model other/model, expected {MODEL_ID}."]


def test_ready_without_digest_refused():
    assert readiness_gate({"n1": ready(digest="")})[0].startswith("n1: Ready but reports no manifest digest")
