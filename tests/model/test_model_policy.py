"""Refusals: pickle weights, unpinned revisions, formats, space, token file, malformed specs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from modelkit import MODEL_ID, REV, make_model

from shadowline.model import policy
from shadowline.model.errors import PolicyError, SourceError, SpaceError, SpecError
from shadowline.model.hf_token import read_token_file, redact
from shadowline.model.spec import parse_source, spec_from_inventory
from shadowline.model.stage import ensure_model
from shadowline.model.status import read_status


def test_pickle_weights_refused(tmp_path: Path):
    src = tmp_path / "pickle-only"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "pytorch_model.bin").write_bytes(b"\x80\x04\x95evil")
    inv = {"id": MODEL_ID, "revision": REV, "source": f"file://{src}", "local_dir": str(tmp_path / "n" / "m")}
    with pytest.raises(PolicyError) as err:
        ensure_model(spec_from_inventory(inv))
    assert err.value.field == "gms_model_allow_pickle"
    assert "pytorch_model.bin" in str(err.value) and "gms_model_allow_pickle: true" in str(err.value)
    assert not Path(inv["local_dir"]).exists()
    status = read_status(spec_from_inventory(inv).status_path)
    assert status is not None and status.state == "Failed" and "pickle" in status.error
    # explicitly selecting pickle files is refused before listing anything
    with pytest.raises(PolicyError) as err:
        ensure_model(spec_from_inventory(inv, allow_patterns=["*.bin", "*.json"]))
    assert err.value.field == "allow_patterns"
    # format pytorch is pickle too
    with pytest.raises(PolicyError) as err:
        ensure_model(spec_from_inventory(dict(inv, format="pytorch")))
    assert err.value.field == "gms_model.format"
    # with allow_pickle the operator has accepted the risk
    ok = ensure_model(spec_from_inventory(dict(inv, format="pytorch"), allow_pickle=True))
    assert ok.state == "Ready" and ok.files == 2


def test_pickle_next_to_safetensors_is_not_staged(tmp_path: Path):
    src = make_model(tmp_path / "both", extra={"pytorch_model.bin": b"\x80\x04", "consolidated.pth": b"\x80\x04"})
    inv = {"id": MODEL_ID, "revision": REV, "source": f"file://{src}", "local_dir": str(tmp_path / "n" / "m")}
    result = ensure_model(spec_from_inventory(inv))
    staged = os.listdir(result.local_dir)
    assert not [n for n in staged if policy.is_pickle(n)]


def test_pickle_renamed_to_safetensors_is_caught(tmp_path: Path):
    src = make_model(tmp_path / "src", extra={"extra.safetensors": b"\x80\x04\x95" + b"x" * 100})
    inv = {"id": MODEL_ID, "revision": REV, "source": f"file://{src}", "local_dir": str(tmp_path / "n" / "m")}
    with pytest.raises(Exception) as err:
        ensure_model(spec_from_inventory(inv))
    assert "extra.safetensors" in str(err.value)
    assert not Path(inv["local_dir"]).exists()


@pytest.mark.parametrize("revision", ["main", "v1.0", "0123456789ABCDEF0123456789ABCDEF01234567", "0123456"])
def test_unpinned_revision_refused(inventory, revision: str):
    inv = dict(inventory, revision=revision)
    with pytest.raises(PolicyError) as err:
        ensure_model(spec_from_inventory(inv))
    assert err.value.field == "gms_model.revision"
    assert "gms_model_allow_unpinned" in str(err.value)
    with pytest.raises(PolicyError):
        ensure_model(spec_from_inventory(inv), check_mode=True)
    assert not Path(inv["local_dir"]).exists()


def test_unpinned_allowed_on_request(inventory):
    inv = dict(inventory, revision="release-2025")
    result = ensure_model(spec_from_inventory(inv, allow_unpinned=True))
    assert result.state == "Ready" and result.revision == "release-2025"
    assert ensure_model(spec_from_inventory(inv, allow_unpinned=True)).changed is False


def test_missing_shard_in_selection_is_refused(inventory):
    spec = spec_from_inventory(inventory, allow_patterns=["model-00001*", "*.json"])
    with pytest.raises(Exception) as err:
        ensure_model(spec)
    assert "model-00002-of-00003.safetensors" in str(err.value)
    assert err.value.field == "allow_patterns"


def test_free_space_checked_before_copying(inventory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(policy, "free_bytes", lambda path: 1000)
    with pytest.raises(SpaceError) as err:
        ensure_model(spec_from_inventory(inventory))
    msg = str(err.value)
    assert "need " in msg and "free 1000 bytes" in msg and err.value.field == "gms_model.local_dir"
    staging = [n for n in os.listdir(Path(inventory["local_dir"]).parent) if "staging" in n]
    assert staging == [], "nothing is fetched when space is short"


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({"revision": REV, "local_dir": "/x/m"}, "gms_model.id"),
        ({"id": MODEL_ID, "local_dir": "/x/m"}, "gms_model.revision"),
        ({"id": MODEL_ID, "revision": REV}, "gms_model.local_dir"),
        ({"id": MODEL_ID, "revision": REV, "local_dir": "relative/m"}, "gms_model.local_dir"),
        ({"id": MODEL_ID, "revision": REV, "local_dir": "/x/.hidden"}, "gms_model.local_dir"),
        ({"id": MODEL_ID, "revision": REV, "local_dir": "/x/m", "format": "gguf"}, "gms_model.format"),
        ({"id": MODEL_ID, "revision": REV, "local_dir": "/x/m", "source": "s3://bucket/m"}, "gms_model.source"),
        ({"id": MODEL_ID, "revision": REV, "local_dir": "/x/m", "source": "file://host/m"}, "gms_model.source"),
        ({"id": MODEL_ID, "revision": REV, "local_dir": "/x/m", "source": "rsync://u:pw@h/m/p"}, "gms_model.source"),
        ({"id": "not a repo", "revision": REV, "local_dir": "/x/m"}, "gms_model.id"),
    ],
)
def test_spec_errors_name_the_field(model, field):
    with pytest.raises(SpecError) as err:
        spec_from_inventory(model)
    assert err.value.field == field
    assert err.value.fix


def test_source_uris():
    assert parse_source(None, MODEL_ID).uri == f"hf://{MODEL_ID}"
    assert parse_source("hf://org/x", MODEL_ID).repo == "org/x"
    daemon = parse_source("rsync://head-0:8873/models/llama", MODEL_ID)
    assert (daemon.host, daemon.port, daemon.path) == ("head-0", 8873, "/models/llama")
    assert daemon.rsync_url == "rsync://head-0:8873/models/llama/"
    ssh = parse_source("rsync+ssh://svc@head-0/srv/models/llama", MODEL_ID)
    assert ssh.rsync_url == "svc@head-0:/srv/models/llama/"
    assert parse_source("file:///shared/m/", MODEL_ID).path == "/shared/m"


def test_unsafe_listing_paths_refused():
    for bad in ["../etc/passwd", "/abs", "a/../../b", "a\\b", ""]:
        with pytest.raises(SourceError):
            policy.safe_relpath(bad)
    assert policy.safe_relpath("sub/model.safetensors") == "sub/model.safetensors"


def test_token_file_rules(tmp_path: Path, token_file: Path):
    assert read_token_file(str(token_file)) == "hf_test_token_0123456789"
    token_file.chmod(0o644)
    with pytest.raises(SpecError) as err:
        read_token_file(str(token_file))
    assert "chmod 0600" in str(err.value) and "hf_test_token" not in str(err.value)
    with pytest.raises(SpecError) as err:
        read_token_file(str(tmp_path / "nope"))
    assert err.value.field == "gms_model_hf_token_file"
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(SpecError):
        read_token_file(str(empty))
    assert redact("Bearer abc123 failed", ["abc123"]) == "Bearer *** failed"


def test_symlinked_local_dir_refused(inventory, tmp_path: Path):
    real = tmp_path / "nvme" / "tiny-llm"
    real.mkdir(parents=True)
    link = Path(inventory["local_dir"])
    link.parent.mkdir(parents=True)
    link.symlink_to(real, target_is_directory=True)
    with pytest.raises(SpecError) as err:
        ensure_model(spec_from_inventory(inventory))
    assert err.value.field == "gms_model.local_dir" and str(real) in str(err.value)
