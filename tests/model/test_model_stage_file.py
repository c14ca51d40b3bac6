"""file:// staging, manifest, fast and full re-verification, corruption repair, check mode."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from modelkit import MODEL_ID, REV, REV2, make_model

from shadowline.model import hashing
from shadowline.model.errors import SpecError
from shadowline.model.manifest import MANIFEST_NAME, files_digest, load_manifest
from shadowline.model.spec import spec_from_inventory
from shadowline.model.stage import ensure_model, remove_model
from shadowline.model.status import read_status


def _spec(inv, **kw):
    return spec_from_inventory(inv, **kw)


def _hashed_bytes() -> int:
    return hashing.COUNTERS.snapshot()[1]


def test_file_source_stages_with_manifest(inventory, source_model: Path):
    spec = _spec(inventory)
    result = ensure_model(spec)
    assert result.changed and result.state == "Ready"
    local = Path(spec.local_dir)
    staged = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    # default selection: weights, configs, tokenizer; not README, never hidden files
    assert staged == sorted(
        [
            MANIFEST_NAME,
            "config.json",
            "model-00001-of-00003.safetensors",
            "model-00002-of-00003.safetensors",
            "model-00003-of-00003.safetensors",
            "model.safetensors.index.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    )
    manifest = json.loads((local / MANIFEST_NAME).read_text())
    assert manifest["model_id"] == MODEL_ID and manifest["revision"] == REV
    assert manifest["source"] == f"file://{source_model}"
    for entry in manifest["files"]:
        data = (source_model / entry["path"]).read_bytes()
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        st = os.stat(local / entry["path"])
        assert (entry["mtime_ns"], entry["ino"]) == (st.st_mtime_ns, st.st_ino)
    weights = sum(e["size"] for e in manifest["files"] if e["path"].endswith(".safetensors"))
    assert manifest["weight_bytes"] == weights == result.weight_bytes
    assert manifest["total_bytes"] == result.total_bytes
    # digest = sha256 over sorted "<sha256> <size> <path>\n" lines
    lines = "".join(
        f"{e['sha256']} {e['size']} {e['path']}\n" for e in sorted(manifest["files"], key=lambda e: e["path"])
    )
    assert manifest["digest"] == result.digest == "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
    status = read_status(spec.status_path)
    assert status is not None and status.state == "Ready" and status.digest == result.digest and status.revision == REV
    # nothing left behind but the model, its status file and the lock
    assert sorted(os.listdir(local.parent)) == sorted(
        [local.name, f".shadowline-model-{local.name}.status.json", f".shadowline-model-{local.name}.lock"]
    )


def test_same_content_same_digest_on_two_nodes(inventory, tmp_path: Path):
    a = ensure_model(_spec(inventory))
    b = ensure_model(_spec(dict(inventory, local_dir=str(tmp_path / "node2" / "m"))))
    assert a.digest == b.digest


def test_fast_reverify_hashes_nothing(tmp_path: Path):
    src = make_model(tmp_path / "src100", shards=100, shard_kib=16)
    inv = {"id": MODEL_ID, "revision": REV, "source": f"file://{src}", "local_dir": str(tmp_path / "n" / "m")}
    first = ensure_model(_spec(inv))
    assert first.files == 104
    before = _hashed_bytes()
    start = time.perf_counter()
    again = ensure_model(_spec(inv))
    elapsed = time.perf_counter() - start
    assert not again.changed and again.state == "Ready"
    assert _hashed_bytes() == before, "fast re-verify must not read file contents"
    assert again.hashed_bytes == 0
    assert elapsed < 1.0, f"fast re-verify of 104 files took {elapsed:.3f}s"
    # full verify rehashes everything
    full = ensure_model(_spec(inv, verify="full"))
    assert not full.changed
    assert _hashed_bytes() - before == full.total_bytes


@pytest.mark.parametrize("damage", ["truncate", "rewrite_same_size", "bitflip_keep_mtime", "delete", "stray_pickle"])
def test_damaged_copy_is_detected_and_restaged(inventory, damage: str):
    spec = _spec(inventory)
    first = ensure_model(spec)
    local = Path(spec.local_dir)
    shard = local / "model-00002-of-00003.safetensors"
    original = shard.read_bytes()
    st = shard.stat()
    if damage == "truncate":
        shard.write_bytes(original[:-100])
    elif damage == "rewrite_same_size":
        shard.write_bytes(original[:-4] + b"\0\0\0\0")
    elif damage == "bitflip_keep_mtime":
        with open(shard, "r+b") as fh:
            fh.seek(len(original) // 2)
            byte = fh.read(1)
            fh.seek(len(original) // 2)
            fh.write(bytes([byte[0] ^ 0xFF]))
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif damage == "delete":
        shard.unlink()
    elif damage == "stray_pickle":
        (local / "pytorch_model.bin").write_bytes(b"\x80\x04evil")

    verify = "full" if damage == "bitflip_keep_mtime" else "fast"
    result = ensure_model(_spec(inventory, verify=verify))
    assert result.changed and result.state == "Ready"
    assert result.digest == first.digest
    assert shard.read_bytes() == original
    assert not (local / "pytorch_model.bin").exists()
    if damage != "stray_pickle":
        assert "model-00002-of-00003.safetensors" in result.repaired
    assert any("failed" in a and "verification" in a for a in result.actions)
    # the other files were kept, not copied again
    assert result.fetched_bytes == (len(original) if damage != "stray_pickle" else 0)
    assert ensure_model(spec).changed is False


def test_ctime_only_change_rehashes_and_refreshes(inventory):
    spec = _spec(inventory)
    ensure_model(spec)
    cfg = Path(spec.local_dir) / "config.json"
    os.chmod(cfg, 0o640)  # changes ctime, not content
    before = _hashed_bytes()
    result = ensure_model(spec)
    assert not result.changed
    assert _hashed_bytes() - before == cfg.stat().st_size  # only that file was read
    assert any("refreshed stat keys" in n for n in result.notes)
    before = _hashed_bytes()
    ensure_model(spec)
    assert _hashed_bytes() == before


def test_revision_change_replaces_model(inventory, tmp_path: Path):
    spec = _spec(inventory)
    first = ensure_model(spec)
    new_src = make_model(tmp_path / "shared" / "v2", seed=3)
    spec2 = _spec(dict(inventory, revision=REV2, source=f"file://{new_src}"))
    second = ensure_model(spec2)
    assert second.changed and second.revision == REV2 and second.digest != first.digest
    assert any("replace" in a for a in second.actions)
    assert load_manifest(spec.local_dir).revision == REV2
    leftovers = [n for n in os.listdir(Path(spec.local_dir).parent) if ".staging-" in n or ".previous" in n]
    assert leftovers == []


def test_check_mode_changes_nothing(inventory, tmp_path: Path):
    spec = _spec(inventory)
    node = Path(spec.local_dir).parent.parent
    result = ensure_model(spec, check_mode=True)
    assert result.changed and result.state == "Pending"
    assert result.files == 7 and result.total_bytes > 0 and result.digest is None
    assert not node.exists(), "check mode must not create anything"
    ensure_model(spec)
    snapshot = {p: p.stat().st_mtime_ns for p in node.rglob("*")}
    shard = Path(spec.local_dir) / "model-00001-of-00003.safetensors"
    shard.write_bytes(b"broken")
    snapshot[shard] = shard.stat().st_mtime_ns
    result = ensure_model(spec, check_mode=True)
    assert result.changed and "model-00001-of-00003.safetensors" in result.repaired
    assert {p: p.stat().st_mtime_ns for p in node.rglob("*")} == snapshot
    assert shard.read_bytes() == b"broken"


def test_foreign_local_dir_is_never_deleted(inventory):
    spec = _spec(inventory)
    local = Path(spec.local_dir)
    local.mkdir(parents=True)
    (local / "precious.txt").write_text("operator data")
    with pytest.raises(SpecError) as err:
        ensure_model(spec)
    assert err.value.field == "gms_model.local_dir"
    assert (local / "precious.txt").exists()


def test_manifest_tamper_forces_restage(inventory):
    spec = _spec(inventory)
    first = ensure_model(spec)
    path = Path(spec.local_dir) / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["files"][0]["sha256"] = "0" * 64
    path.write_text(json.dumps(data))
    # an unusable manifest is still ours (not foreign data): the directory is restaged
    result = ensure_model(spec)
    assert result.changed and result.digest == first.digest
    assert any("unusable" in n for n in result.notes)


def test_source_manifest_is_used_for_verification(inventory, tmp_path: Path):
    """A Ready local_dir can serve as a file:// source; its manifest supplies expected hashes."""
    first = ensure_model(_spec(inventory))
    node2 = dict(inventory, source=f"file://{first.local_dir}", local_dir=str(tmp_path / "node2" / "m"))
    second = ensure_model(_spec(node2))
    assert second.digest == first.digest
    assert any("source's manifest" in n for n in second.notes)
    # a source manifest at another revision is refused
    other = dict(node2, revision=REV2, local_dir=str(tmp_path / "node3" / "m"))
    with pytest.raises(Exception) as err:
        ensure_model(_spec(other))
    assert "gms_model.revision" in str(getattr(err.value, "field", "")) and REV in str(err.value)


def test_remove_model(inventory):
    spec = _spec(inventory)
    ensure_model(spec)
    check = remove_model(spec, check_mode=True)
    assert check.changed and Path(spec.local_dir).exists()
    result = remove_model(spec)
    assert result.changed
    assert not Path(spec.local_dir).exists() and not Path(spec.status_path).exists()
    assert remove_model(spec).changed is False


def test_digest_is_content_only():
    from shadowline.model.manifest import FileEntry

    a = [FileEntry("b", 2, "22", 1, 1, 1), FileEntry("a", 1, "11", 5, 5, 5)]
    b = [FileEntry("a", 1, "11", 9, 9, 9), FileEntry("b", 2, "22", 8, 8, 8)]
    assert files_digest(a) == files_digest(b)
    assert files_digest(a) != files_digest([FileEntry("a", 1, "12"), FileEntry("b", 2, "22")])
