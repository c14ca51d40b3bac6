"""Every broken inventory under broken/ is refused by playbooks/preflight.yml with its expected message,
and no file appears on the host. The local inventory passes.

The playbook runs for real (ansible-playbook, local connection). Cases that need a machine state set it
up for real: a process listening on the port, a read-only mount, a file in the way.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
BROKEN = Path(__file__).parent / "broken"
CASES = sorted(p.stem for p in BROKEN.glob("*.yml"))
WATCHED = ["/run/shadowline", "/var/lib/shadowline", "/etc/shadowline", "/tmp/shadowline-preflight-ro/gms",
           "/opt/shadowline"]
RO_MOUNT = "/tmp/shadowline-preflight-ro"
FILE_IN_WAY = "/tmp/shadowline-preflight-file"
BUSY_PORT = 18931


def expectations(case: str) -> list[str]:
    lines = (BROKEN / f"{case}.yml").read_text().splitlines()
    return [line.split("# expect: ", 1)[1] for line in lines if line.startswith("# expect: ")]


def run_preflight(inventory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_FORCE_COLOR": "0", "PYTHONWARNINGS": "ignore"}
    bindir = Path(sys.executable).parent
    return subprocess.run([str(bindir / "ansible-playbook"), "-i", str(inventory), "playbooks/preflight.yml", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def snapshot() -> set[str]:
    found: set[str] = set()
    for top in WATCHED:
        for dirpath, dirnames, filenames in os.walk(top):
            found.update(os.path.join(dirpath, n) for n in dirnames + filenames)
        if os.path.exists(top):
            found.add(top)
    found.update(str(p) for p in Path("/etc/systemd/system").glob("shadowline-*"))
    return found


@contextmanager
def machine_state() -> Iterator[None]:
    """The real conditions some cases need: a foreign listener, a read-only mount, a file in the way."""
    with ExitStack() as stack:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", BUSY_PORT))
        listener.listen()
        stack.callback(listener.close)
        os.makedirs(RO_MOUNT, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "shadowline-preflight-ro", RO_MOUNT], check=True)
        stack.callback(os.rmdir, RO_MOUNT)
        stack.callback(subprocess.run, ["umount", RO_MOUNT], check=True)
        Path(FILE_IN_WAY).write_text("not a directory\n")
        stack.callback(os.unlink, FILE_IN_WAY)
        yield


@pytest.fixture(scope="module")
def outcomes() -> dict[str, tuple[subprocess.CompletedProcess[str], set[str]]]:
    if os.geteuid() != 0:
        pytest.fail("the broken-inventory tests need root (they mount a read-only tmpfs); run them as root")
    before = snapshot()
    with machine_state(), ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(zip(CASES, pool.map(lambda c: run_preflight(BROKEN / f"{c}.yml"), CASES)))
    created = snapshot() - before
    return {case: (result, created) for case, result in results.items()}


def test_there_are_enough_cases():
    assert len(CASES) >= 15


@pytest.mark.parametrize("case", CASES)
def test_broken_inventory_is_refused(case: str, outcomes) -> None:
    result, created = outcomes[case]
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    for expected in expectations(case):
        assert expected in output, f"{case}: expected {expected!r} in:\n{output}"
    assert "nothing was changed on any host" in output
    assert created == set(), f"files appeared on the host: {sorted(created)}"


def test_local_inventory_passes_and_changes_nothing() -> None:
    before = snapshot()
    result = run_preflight(ROOT / "inventories" / "local")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "preflight passed for deployment local" in output
    assert "changed=0" in output
    assert snapshot() == before


def test_insecure_is_said_loudly() -> None:
    """gms_insecure: true passes preflight with a warning that says what is exposed (issue #13); the default
    (secure) says nothing of the kind."""
    insecure = run_preflight(ROOT / "inventories" / "local", "-e", "gms_insecure=true")
    output = " ".join((insecure.stdout + insecure.stderr).split())
    assert insecure.returncode == 0, output
    assert "[WARNING]: gms_insecure is true: deployment local runs etcd without authentication" in output
    assert "forge slot records" in output
    secure = run_preflight(ROOT / "inventories" / "local")
    assert "gms_insecure is true" not in secure.stdout + secure.stderr
