"""Fixtures for the model-lifecycle tests (helpers in modelkit.py): a model source, an inventory,
the fake Hub, a token file, an rsync daemon on 127.0.0.1 and an ansible-playbook runner that loads
this checkout as the shadowline.gms collection. Nothing here leaves the loopback interface.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from modelkit import MODEL_ID, REPO_ROOT, REV, REV2, VENV_BIN, FakeHub, free_port, make_model, model_files  # noqa: E402


# --------------------------------------------------------------------------- model factory
@pytest.fixture
def source_model(tmp_path: Path) -> Path:
    return make_model(tmp_path / "shared" / "tiny-llm")


@pytest.fixture
def inventory(tmp_path: Path, source_model: Path) -> dict[str, Any]:
    return {
        "id": MODEL_ID,
        "revision": REV,
        "source": f"file://{source_model}",
        "local_dir": str(tmp_path / "node" / "models" / "tiny-llm"),
        "format": "safetensors",
    }


# --------------------------------------------------------------------------- free ports
# --------------------------------------------------------------------------- fake hub
@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    pytest.importorskip("huggingface_hub")
    src = make_model(
        tmp_path / "hub-src",
        seed=7,
        extra={"pytorch_model.bin": b"\x80\x04pickle", ".gitattributes": b"*.safetensors filter=lfs\n"},
    )
    src2 = make_model(tmp_path / "hub-src2", seed=8)
    hub = FakeHub(
        repo=MODEL_ID,
        commits={REV: model_files(src), REV2: model_files(src2)},
        branches={"main": REV2},
        token="hf_test_token_0123456789",
    )
    hub.start()
    # keep huggingface_hub away from the real cache and the network
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    yield hub
    hub.stop()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "secrets" / "hf-token"
    path.parent.mkdir()
    path.write_text("hf_test_token_0123456789\n")
    path.chmod(0o600)
    return path


# --------------------------------------------------------------------------- rsync daemon
@dataclass
class RsyncDaemon:
    port: int
    root: Path
    proc: subprocess.Popen[bytes]

    def url(self, rel: str) -> str:
        return f"rsync://127.0.0.1:{self.port}/models/{rel}"


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the test process dies, even if it is SIGKILLed."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@pytest.fixture
def rsync_daemon(tmp_path: Path) -> Iterator[RsyncDaemon]:
    rsync = shutil.which("rsync")
    if not rsync:
        pytest.skip("rsync not installed (apt-get install -y rsync)")
    root = tmp_path / "rsync-root"
    root.mkdir()
    conf = tmp_path / "rsyncd.conf"
    port = free_port()
    conf.write_text(
        "\n".join(
            [
                "use chroot = no",
                f"pid file = {tmp_path}/rsyncd.pid",
                f"lock file = {tmp_path}/rsyncd.lock",
                f"log file = {tmp_path}/rsyncd.log",
                "address = 127.0.0.1",
                f"uid = {os.getuid()}",
                f"gid = {os.getgid()}",
                "[models]",
                f"  path = {root}",
                "  read only = yes",
                "",
            ]
        )
    )
    proc = subprocess.Popen(
        [rsync, "--daemon", "--no-detach", f"--config={conf}", f"--port={port}", "--address=127.0.0.1"],
        preexec_fn=_die_with_parent,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(
                    f"rsync daemon exited: {(tmp_path / 'rsyncd.log').read_text() if (tmp_path / 'rsyncd.log').exists() else ''}"
                )
            time.sleep(0.05)
    yield RsyncDaemon(port=port, root=root, proc=proc)
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- ansible runner
@dataclass
class AnsibleRun:
    rc: int
    stdout: str
    stderr: str
    result: dict[str, Any]


@pytest.fixture(scope="session")
def collections_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A collections dir where ansible_collections/shadowline/gms -> this checkout."""
    root = tmp_path_factory.mktemp("collections")
    ns = root / "ansible_collections" / "shadowline"
    ns.mkdir(parents=True)
    (ns / "gms").symlink_to(REPO_ROOT, target_is_directory=True)
    return root


def _ansible_env(collections_path: Path, tmp_path: Path, extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "ANSIBLE_COLLECTIONS_PATH": str(collections_path),
            "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
            "ANSIBLE_LOCALHOST_WARNING": "false",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
            "ANSIBLE_REMOTE_TMP": str(tmp_path / "ansible-remote-tmp"),
        }
    )
    env.update(extra or {})
    return env


@pytest.fixture
def run_playbook(collections_path: Path, tmp_path: Path):
    """Run tasks (each registered under its name) in one ansible-playbook run on localhost.

    Returns (AnsibleRun with .result = {name: registered result}) so one ansible start-up covers a
    whole scenario. Task dicts may carry check_mode / diff / ignore_errors / environment.
    """
    playbook_bin = VENV_BIN / "ansible-playbook"
    if not playbook_bin.exists():
        pytest.skip("ansible not installed in the venv")

    def run(tasks: list[tuple[str, dict[str, Any]]], env: dict[str, str] | None = None) -> AnsibleRun:
        out = tmp_path / f"results-{time.monotonic_ns()}.json"
        play_tasks = []
        for name, task in tasks:
            play_tasks.append(dict(task, name=name, register=f"r_{name}"))
        collected = "{" + ", ".join(f"'{name}': r_{name}" for name, _unused in tasks) + "}"
        play_tasks.append(
            {
                "name": "collect",
                "ansible.builtin.copy": {"content": "{{ " + collected + " | to_json }}", "dest": str(out)},
            }
        )
        playbook = [{"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": play_tasks}]
        path = tmp_path / f"play-{time.monotonic_ns()}.yml"
        path.write_text(json.dumps(playbook))  # JSON is YAML
        proc = subprocess.run(
            [str(playbook_bin), str(path)],
            capture_output=True,
            text=True,
            env=_ansible_env(collections_path, tmp_path, env),
            cwd=tmp_path,
            timeout=180,
            check=False,
        )
        result = json.loads(out.read_text()) if out.exists() else {}
        return AnsibleRun(proc.returncode, proc.stdout, proc.stderr, result)

    return run
