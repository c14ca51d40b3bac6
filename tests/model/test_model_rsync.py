"""rsync:// staging: pull from an rsync daemon on 127.0.0.1 (the air-gapped path)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from modelkit import MODEL_ID, REV, REV2, make_model

from shadowline.model.errors import SourceError
from shadowline.model.fetch_rsync import parse_listing
from shadowline.model.spec import spec_from_inventory
from shadowline.model.stage import ensure_model


def test_rsync_daemon_pull(rsync_daemon, tmp_path: Path):
    make_model(rsync_daemon.root / "tiny-llm", extra={"pytorch_model.bin": b"\x80\x04"})
    inv = {
        "id": MODEL_ID,
        "revision": REV,
        "source": rsync_daemon.url("tiny-llm"),
        "local_dir": str(tmp_path / "n" / "m"),
    }
    spec = spec_from_inventory(inv)
    check = ensure_model(spec, check_mode=True)
    assert check.changed and check.files == 7 and not Path(spec.local_dir).exists()
    result = ensure_model(spec)
    assert result.state == "Ready" and result.files == 7
    local = Path(spec.local_dir)
    assert not (local / "pytorch_model.bin").exists() and not (local / ".rsync-partial").exists()
    reference = ensure_model(
        spec_from_inventory(
            dict(inv, source=f"file://{rsync_daemon.root / 'tiny-llm'}", local_dir=str(tmp_path / "ref" / "m"))
        )
    )
    assert result.digest == reference.digest
    assert ensure_model(spec).changed is False
    # damage one file: only it is pulled again
    shard = local / "model-00002-of-00003.safetensors"
    size = shard.stat().st_size
    shard.write_bytes(b"x")
    repaired = ensure_model(spec)
    assert repaired.repaired == ["model-00002-of-00003.safetensors"] and repaired.fetched_bytes == size
    assert repaired.digest == result.digest


def test_rsync_from_a_staged_node_verifies_against_its_manifest(rsync_daemon, tmp_path: Path):
    src = make_model(tmp_path / "src")
    head = ensure_model(
        spec_from_inventory(
            {
                "id": MODEL_ID,
                "revision": REV,
                "source": f"file://{src}",
                "local_dir": str(rsync_daemon.root / "tiny-llm"),
            }
        )
    )
    inv = {
        "id": MODEL_ID,
        "revision": REV,
        "source": rsync_daemon.url("tiny-llm"),
        "local_dir": str(tmp_path / "n" / "m"),
    }
    result = ensure_model(spec_from_inventory(inv))
    assert result.digest == head.digest
    assert any("source's manifest" in n for n in result.notes)
    with pytest.raises(SourceError) as err:
        ensure_model(spec_from_inventory(dict(inv, revision=REV2, local_dir=str(tmp_path / "n2" / "m"))))
    assert err.value.field == "gms_model.revision"


def test_rsync_errors_are_explained(rsync_daemon, tmp_path: Path):
    inv = {"id": MODEL_ID, "revision": REV, "source": rsync_daemon.url("nope"), "local_dir": str(tmp_path / "n" / "m")}
    with pytest.raises(SourceError) as err:
        ensure_model(spec_from_inventory(inv))
    assert "exit" in str(err.value) and err.value.field == "gms_model.source"
    bad_module = f"rsync://127.0.0.1:{rsync_daemon.port}/nomodule/x"
    with pytest.raises(SourceError) as err:
        ensure_model(spec_from_inventory(dict(inv, source=bad_module)))
    assert "exit 5" in str(err.value)


def test_parse_listing():
    text = (
        "drwxr-xr-x          4,096 2026/11/22 09:14:52 .\n"
        "-rw-r--r--      1,234,567 2026/11/22 09:14:52 a.safetensors\n"
        "-rw-r--r--              3 2026/11/22 09:14:52 sub/b c.json\n"
        "lrwxrwxrwx              3 2026/11/22 09:14:52 link\n"
    )
    files = parse_listing(text)
    assert [(f.path, f.size) for f in files] == [("a.safetensors", 1234567), ("sub/b c.json", 3)]


def test_rsync_missing_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from shadowline.model import fetch_rsync
    from shadowline.model.errors import MissingDependencyError

    monkeypatch.setattr(fetch_rsync.shutil, "which", lambda name: None)
    inv = {"id": MODEL_ID, "revision": REV, "source": "rsync://127.0.0.1:1/m/x", "local_dir": str(tmp_path / "m")}
    with pytest.raises(MissingDependencyError) as err:
        ensure_model(spec_from_inventory(inv))
    assert "install rsync" in str(err.value)


FAKE_SSH = """#!/bin/sh
# stand-in for ssh: drop options and the host, run the remote command here (no network)
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
echo "$1" >> "$FAKE_SSH_LOG"
shift
exec "$@"
"""


def test_rsync_over_ssh_code_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """rsync+ssh:// runs rsync with -e 'ssh -o BatchMode=yes ...'; a fake ssh on PATH runs the remote side locally."""
    if not shutil.which("rsync"):
        pytest.skip("rsync not installed")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text(FAKE_SSH)
    (bindir / "ssh").chmod(0o755)
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    src = make_model(tmp_path / "srv" / "models" / "tiny-llm")
    inv = {
        "id": MODEL_ID,
        "revision": REV,
        "source": f"rsync+ssh://svc@head-0{src}",
        "local_dir": str(tmp_path / "n" / "m"),
    }
    result = ensure_model(spec_from_inventory(inv))
    assert result.state == "Ready" and result.files == 7
    hosts = set(log.read_text().split())
    assert hosts == {"head-0"}  # rsync passes the login as -l svc
    ref = ensure_model(spec_from_inventory(dict(inv, source=f"file://{src}", local_dir=str(tmp_path / "r" / "m"))))
    assert ref.digest == result.digest
