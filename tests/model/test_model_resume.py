"""Interrupted staging: nothing looks complete, and a re-run resumes keeping verified files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from modelkit import MODULE_UTILS, REV

from shadowline.model.errors import BusyError
from shadowline.model.fsutil import DirLock
from shadowline.model.journal import JOURNAL_NAME
from shadowline.model.manifest import MANIFEST_NAME
from shadowline.model.spec import spec_from_inventory
from shadowline.model.stage import ensure_model
from shadowline.model.status import read_status

KILLER = textwrap.dedent("""
    import json, os, signal, sys
    sys.path.insert(0, sys.argv[1])
    from shadowline.model import fetch_file
    from shadowline.model.spec import spec_from_inventory
    from shadowline.model.stage import ensure_model

    real = fetch_file.copy_and_hash
    copied = []

    def copy_then_die(src, dst, **kw):
        if len(copied) == 2:
            # third file: write half of it, then die like a node losing power / a killed job
            data = open(src, "rb").read()
            with open(dst, "wb") as fh:
                fh.write(data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        copied.append(src)
        return real(src, dst, **kw)

    fetch_file.copy_and_hash = copy_then_die
    spec = spec_from_inventory(json.loads(sys.argv[2]), workers=1)
    ensure_model(spec, progress_interval=0)
    """)


def test_killed_mid_copy_then_resume(inventory, tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, str(MODULE_UTILS), json.dumps(inventory)],
        capture_output=True,
        text=True,
        timeout=60, check=False
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    spec = spec_from_inventory(inventory)
    local = Path(spec.local_dir)
    assert not local.exists(), "an interrupted staging must not leave local_dir behind"
    staging = Path(spec.staging_dir(REV))
    assert staging.is_dir()
    assert not (staging / MANIFEST_NAME).exists()
    journal = (staging / JOURNAL_NAME).read_text().splitlines()
    kept = [json.loads(line)["path"] for line in journal[1:]]
    assert len(kept) == 2
    parts = [p.name for p in staging.rglob(".*.part")]
    assert len(parts) == 1, "the file being copied is left as a hidden .part"
    status = read_status(spec.status_path)
    assert status is not None and status.state == "Downloading" and status.progress is not None
    inodes = {rel: os.stat(staging / rel).st_ino for rel in kept}

    result = ensure_model(spec)
    assert result.changed and result.state == "Ready"
    assert any("resume staging" in a and "2 of 7" in a for a in result.actions)
    for rel, ino in inodes.items():
        assert os.stat(local / rel).st_ino == ino, f"{rel} was copied again instead of kept"
    kept_bytes = sum((local / rel).stat().st_size for rel in kept)
    assert result.fetched_bytes == result.total_bytes - kept_bytes
    assert not staging.exists()
    assert not list(local.rglob(".*")), "no hidden leftovers (.part, journal) in the final directory"
    fresh = ensure_model(spec_from_inventory(dict(inventory, local_dir=str(tmp_path / "other" / "m"))))
    assert fresh.digest == result.digest


def test_hand_made_partial_staging_dir_is_repaired(inventory, source_model: Path):
    spec = spec_from_inventory(inventory)
    staging = Path(spec.staging_dir(REV))
    staging.mkdir(parents=True)
    shard = "model-00001-of-00003.safetensors"
    data = (source_model / shard).read_bytes()
    (staging / shard).write_bytes(data[:1000])  # truncated, not journaled
    (staging / "model-00002-of-00003.safetensors").write_bytes(
        (source_model / "model-00002-of-00003.safetensors").read_bytes()
    )
    (staging / "junk.bin").write_bytes(b"\x80\x04")  # not wanted
    (staging / JOURNAL_NAME).write_text(
        json.dumps({"model_id": spec.model_id, "revision": REV})
        + "\n"
        + json.dumps({"path": shard, "size": len(data), "sha256": "0" * 64, "mtime_ns": 1, "ctime_ns": 1, "ino": 1})
        + "\n{torn line"
    )
    result = ensure_model(spec)
    assert result.state == "Ready"
    local = Path(spec.local_dir)
    assert (local / shard).read_bytes() == data
    assert not (local / "junk.bin").exists()
    assert result.fetched_bytes == result.total_bytes  # nothing unjournaled was trusted
    full = ensure_model(spec_from_inventory(inventory, verify="full"))
    assert not full.changed


def test_stale_staging_of_other_revision_is_removed(inventory):
    spec = spec_from_inventory(inventory)
    stale = Path(spec.staging_dir("f" * 40))
    stale.mkdir(parents=True)
    (stale / "x.safetensors").write_bytes(b"0" * 100)
    result = ensure_model(spec)
    assert not stale.exists()
    assert any("stale staging" in a for a in result.actions)


def test_concurrent_run_is_refused(inventory):
    spec = spec_from_inventory(inventory)
    os.makedirs(spec.parent, exist_ok=True)
    lock = DirLock(spec.lock_path)
    assert lock.acquire()
    try:
        with pytest.raises(BusyError) as err:
            ensure_model(spec)
        assert str(os.getpid()) in str(err.value)
    finally:
        lock.release()
    assert ensure_model(spec).state == "Ready"
