"""A model source is not trusted to stay inside itself (issue #13): each attack is refused naming the file,
with nothing staged, and never hangs or copies without end."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
from modelkit import MODEL_ID, REV

from shadowline.model import hashing
from shadowline.model.errors import SourceError, SpecError
from shadowline.model.spec import parse_source, spec_from_inventory
from shadowline.model.stage import ensure_model


def _refused(inventory: dict, needle: str) -> SourceError:
    spec = spec_from_inventory(inventory)
    with pytest.raises(SourceError) as err:
        ensure_model(spec)
    assert needle in str(err.value) and err.value.field == "gms_model.source"
    local = Path(spec.local_dir)
    assert not local.exists() or not any(local.iterdir()), "nothing may be staged"
    return err.value


def test_symlink_out_of_the_tree_is_refused(inventory, source_model: Path, tmp_path: Path):
    secret = tmp_path / "root-only"
    secret.write_text("password")
    secret.chmod(0o600)
    (source_model / "tokenizer.json").unlink()
    (source_model / "tokenizer.json").symlink_to(secret)
    err = _refused(inventory, "tokenizer.json is a symlink to")
    assert str(secret) in str(err) and "outside the source directory" in str(err) and "password" not in str(err)


def test_symlink_inside_the_tree_is_staged(inventory, source_model: Path):
    (source_model / "sub").mkdir()
    os.replace(source_model / "tokenizer.json", source_model / "sub" / "tok.json")
    (source_model / "tokenizer.json").symlink_to("sub/tok.json")
    result = ensure_model(spec_from_inventory(inventory))
    assert result.state == "Ready"
    staged = Path(inventory["local_dir"]) / "tokenizer.json"
    assert not staged.is_symlink() and staged.read_bytes() == (source_model / "sub" / "tok.json").read_bytes()


def test_symlink_to_dev_zero_is_refused_not_copied(inventory, source_model: Path):
    (source_model / "tokenizer.json").unlink()
    (source_model / "tokenizer.json").symlink_to("/dev/zero")
    _refused(inventory, "tokenizer.json is a symlink to /dev/zero")


def test_device_file_is_refused(inventory, source_model: Path):
    if os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")
    (source_model / "config.json").unlink()
    os.mknod(source_model / "config.json", 0o644 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
    _refused(inventory, "config.json is a character device, not a regular file")


def test_fifo_is_refused_without_hanging(inventory, source_model: Path):
    (source_model / "config.json").unlink()
    os.mkfifo(source_model / "config.json")
    _refused(inventory, "config.json is a FIFO, not a regular file")


def test_socket_is_refused(inventory, source_model: Path):
    (source_model / "config.json").unlink()
    path = str(source_model / "config.json")
    if len(path) > 100:
        pytest.skip("socket path too long for AF_UNIX")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(path)
        _refused(inventory, "config.json is a socket, not a regular file")


def test_root_only_file_of_another_owner_is_refused(inventory, source_model: Path):
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    os.chown(source_model, 65534, 65534)  # the model belongs to nobody; a root-only file is dropped into it
    (source_model / "config.json").chmod(0o600)
    err = _refused(inventory, "config.json is readable only by uid 0 (mode 0600)")
    assert "chmod a+r" in str(err)


def test_owners_own_private_files_are_staged_readable(inventory, source_model: Path):
    for path in source_model.iterdir():
        path.chmod(0o600)  # safetensors.save_file writes 0600; the model's owner owns them
    assert ensure_model(spec_from_inventory(inventory)).state == "Ready"


def test_fifo_never_blocks_the_copy_either(tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="FIFO"):
        hashing.copy_and_hash(str(fifo), str(tmp_path / "out"))


def test_copy_stops_past_the_listed_size(tmp_path: Path):
    src = tmp_path / "grown"
    src.write_bytes(b"x" * 100)
    with pytest.raises(OSError, match="more than the 10 bytes"):
        hashing.copy_and_hash(str(src), str(tmp_path / "out"), max_bytes=10, bufsize=4)


@pytest.mark.parametrize("uri, needle", [
    ("rsync+ssh://-oProxyCommand=touch%20x/srv/m", "host"),
    ("rsync+ssh://-oProxyCommand=x@head/srv/m", "user"),
    ("rsync://-8@head/models/m", "user"),
    ("rsync+ssh://a%20b@head/srv/m", "user"),
    ("rsync+ssh://a%0Ab@head/srv/m", "user"),
])
def test_rsync_option_injection_is_refused(uri: str, needle: str):
    with pytest.raises(SpecError) as err:
        parse_source(uri, MODEL_ID)
    assert err.value.field == "gms_model.source" and needle in str(err.value)


def test_rsync_plain_hosts_and_users_pass():
    assert parse_source("rsync+ssh://stage_user@head-01.cluster/srv/m", MODEL_ID).user == "stage_user"
    assert parse_source("rsync://10.0.0.5:8873/models/m", MODEL_ID).host == "10.0.0.5"
    assert spec_from_inventory({"id": MODEL_ID, "revision": REV, "source": "rsync://[::1]/models/m",
                                "local_dir": "/tmp/x"}).source.host == "::1"
