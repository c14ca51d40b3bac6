"""hf:// staging for real through huggingface_hub, against a fake Hub on 127.0.0.1."""

from __future__ import annotations

import importlib
import os
import subprocess
from pathlib import Path

import pytest
from modelkit import MODEL_ID, REV, REV2

from shadowline.model import fetch_hf
from shadowline.model.errors import MissingDependencyError, SourceError, SpecError, VerifyError
from shadowline.model.spec import spec_from_inventory
from shadowline.model.stage import ensure_model
from shadowline.model.status import read_status


def _inv(tmp_path: Path, **kw):
    inv = {"id": MODEL_ID, "revision": REV, "local_dir": str(tmp_path / "node" / "tiny-llm")}
    inv.update(kw)
    return inv


def _spec(hub, tmp_path, token_file, inv=None, **kw):
    return spec_from_inventory(inv or _inv(tmp_path), hf_token_file=str(token_file), hf_endpoint=hub.endpoint, **kw)


def test_hf_stage_pinned_revision(fake_hub, tmp_path: Path, token_file: Path):
    spec = _spec(fake_hub, tmp_path, token_file)
    result = ensure_model(spec)
    assert result.state == "Ready" and result.revision == REV
    local = Path(spec.local_dir)
    files = fake_hub.commits[REV]
    staged = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    assert "pytorch_model.bin" not in staged and "README.md" not in staged and ".gitattributes" not in staged
    assert not (local / ".cache").exists(), "huggingface_hub metadata is not left in the model dir"
    for rel in staged:
        if rel != "shadowline-manifest.json":
            assert (local / rel).read_bytes() == files[rel]
    # every request carried the token from the file; only the selected files were downloaded
    assert all(auth == f"Bearer {fake_hub.token}" for _unused1, _unused2, auth in fake_hub.requests)
    downloaded = sorted(p.rsplit("/", 1)[-1] for p in fake_hub.downloads())
    assert downloaded == sorted(r.rsplit("/", 1)[-1] for r in staged if r != "shadowline-manifest.json")
    assert all(f"/resolve/{REV}/" in p for p in fake_hub.downloads())
    # the token is nowhere on disk or in the results
    assert fake_hub.token not in repr(result.as_dict())
    assert fake_hub.token not in Path(spec.status_path).read_text()
    # rerun: verified without network
    n = len(fake_hub.requests)
    again = ensure_model(spec)
    assert not again.changed and len(fake_hub.requests) == n


def test_hf_and_file_sources_agree_on_digest(fake_hub, tmp_path: Path, token_file: Path):
    hf = ensure_model(_spec(fake_hub, tmp_path, token_file))
    node2 = ensure_model(
        spec_from_inventory(_inv(tmp_path, source=f"file://{hf.local_dir}", local_dir=str(tmp_path / "n2" / "m")))
    )
    assert node2.digest == hf.digest


def test_hf_resume_and_repair_download_only_whats_missing(fake_hub, tmp_path: Path, token_file: Path):
    spec = _spec(fake_hub, tmp_path, token_file)
    ensure_model(spec)
    shard = Path(spec.local_dir) / "model-00003-of-00003.safetensors"
    shard.write_bytes(b"corrupt")
    fake_hub.requests.clear()
    result = ensure_model(spec)
    assert result.changed and result.repaired == ["model-00003-of-00003.safetensors"]
    assert [p.rsplit("/", 1)[-1] for p in fake_hub.downloads()] == ["model-00003-of-00003.safetensors"]
    assert shard.read_bytes() == fake_hub.commits[REV]["model-00003-of-00003.safetensors"]


def test_hf_corrupted_download_is_refused(fake_hub, tmp_path: Path, token_file: Path):
    good = fake_hub.commits[REV]["model-00001-of-00003.safetensors"]
    fake_hub.corrupt["model-00001-of-00003.safetensors"] = good[:-8] + b"XXXXXXXX"
    spec = _spec(fake_hub, tmp_path, token_file)
    with pytest.raises(VerifyError) as err:
        ensure_model(spec)
    assert "model-00001-of-00003.safetensors" in str(err.value) and "sha256" in str(err.value)
    assert not Path(spec.local_dir).exists()
    assert read_status(spec.status_path).state == "Failed"
    # the mirror is fixed: the re-run fetches only that file
    fake_hub.corrupt.clear()
    fake_hub.requests.clear()
    result = ensure_model(spec)
    assert result.state == "Ready"
    assert [p.rsplit("/", 1)[-1] for p in fake_hub.downloads()] == ["model-00001-of-00003.safetensors"]


def test_hf_small_file_checked_against_git_blob_id(fake_hub, tmp_path: Path, token_file: Path):
    fake_hub.corrupt["config.json"] = fake_hub.commits[REV]["config.json"].replace(b"Llama", b"Evil!")
    with pytest.raises(VerifyError) as err:
        ensure_model(_spec(fake_hub, tmp_path, token_file))
    assert "config.json" in str(err.value) and "git blob id" in str(err.value)


def test_hf_unpinned_branch_resolves_to_commit(fake_hub, tmp_path: Path, token_file: Path):
    spec = _spec(fake_hub, tmp_path, token_file, _inv(tmp_path, revision="main"), allow_unpinned=True)
    result = ensure_model(spec)
    assert result.revision == REV2
    assert any("resolved to commit" in n for n in result.notes)
    assert not ensure_model(spec).changed


def test_hf_errors_name_the_field(fake_hub, tmp_path: Path, token_file: Path):
    with pytest.raises(SpecError) as err:
        ensure_model(_spec(fake_hub, tmp_path, token_file, _inv(tmp_path, revision="f" * 40)))
    assert err.value.field == "gms_model.revision"
    bad = tmp_path / "bad-token"
    bad.write_text("wrong")
    bad.chmod(0o600)
    with pytest.raises(SourceError) as err:
        ensure_model(spec_from_inventory(_inv(tmp_path), hf_token_file=str(bad), hf_endpoint=fake_hub.endpoint))
    assert err.value.field in ("gms_model.id", "gms_model_hf_token_file")
    assert "wrong" not in str(err.value)


def test_hf_check_mode_downloads_nothing(fake_hub, tmp_path: Path, token_file: Path):
    spec = _spec(fake_hub, tmp_path, token_file)
    result = ensure_model(spec, check_mode=True)
    assert result.changed and result.files == 7
    assert fake_hub.downloads() == []
    assert not Path(spec.local_dir).parent.exists()


def test_missing_huggingface_hub_names_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token_file: Path
):
    real = importlib.import_module

    def fake_import(name, *args, **kwargs):
        if name == "huggingface_hub":
            raise ImportError("No module named 'huggingface_hub'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(fetch_hf.importlib, "import_module", fake_import)
    with pytest.raises(MissingDependencyError) as err:
        ensure_model(spec_from_inventory(_inv(tmp_path)))
    assert "pip install 'huggingface_hub>=" in str(err.value)
    assert err.value.field == "gms_model.source"


def test_token_never_in_child_env(monkeypatch: pytest.MonkeyPatch):
    from shadowline.model import fetch_rsync

    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert "HF_TOKEN" not in fetch_rsync._child_env()
    assert os.environ["HF_TOKEN"] == "hf_secret"


RUNTIME_PYTHON = Path(__file__).resolve().parents[2] / ".runtime" / "bin" / "python"


@pytest.mark.skipif(not RUNTIME_PYTHON.exists() or not Path("/usr/bin/python3").exists(),
                    reason="make runtime builds .runtime")
def test_the_role_stages_hf_with_the_runtimes_interpreter_when_the_system_python_lacks_the_hub(
        fake_hub, tmp_path: Path, token_file: Path, run_playbook):
    """Issue #16: Debian's system Python has no huggingface_hub (and refuses pip). The model_cache role runs the
    module with the deployment's runtime interpreter (gms_python), which has it, and stages the model."""
    system = subprocess.run(["/usr/bin/python3", "-c", "import huggingface_hub"], check=False, capture_output=True)
    if system.returncode == 0:
        pytest.skip("this machine's system Python has huggingface_hub: nothing to prove")
    local_dir = tmp_path / "node" / "models" / "tiny-llm"
    role_vars = {"gms_deployment": "hftest", "gms_python": str(RUNTIME_PYTHON),
                 "gms_model": {"id": MODEL_ID, "revision": REV, "source": f"hf://{MODEL_ID}", "local_dir": str(local_dir)},
                 "gms_model_hf_token_file": str(token_file), "model_cache_hf_endpoint": fake_hub.endpoint}
    run = run_playbook([
        ("stage", {"ansible.builtin.include_role": {"name": "shadowline.gms.model_cache"}, "vars": role_vars}),
        ("picked", {"ansible.builtin.debug": {"var": "model_cache_python"}}),
    ], env={"ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3"})
    assert run.rc == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert run.result["picked"]["model_cache_python"] == str(RUNTIME_PYTHON)
    assert any(local_dir.glob("*.safetensors")) and (local_dir / "shadowline-manifest.json").exists()
