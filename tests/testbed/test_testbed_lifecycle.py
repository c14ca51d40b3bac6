"""up is idempotent, a different size is refused, down leaves nothing: also after a failed or forgotten up."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import testbed.boot as tb_boot
import testbed.testbed as tb

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(tb.__file__)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/usr/bin/python3", str(SCRIPT), *args], capture_output=True, text=True, timeout=90, check=False)


def test_up_twice_only_checks(testbed):
    first = testbed(nodes=3)
    again = tb.up(3, False)
    assert [h.pid for h in again.hosts] == [h.pid for h in first.hosts]
    proc = cli("up", "--nodes", "3")
    assert proc.returncode == 0, proc.stderr
    assert "already up" in proc.stdout and "healthy" in proc.stdout
    assert [h.pid for h in tb.load_journal().hosts] == [h.pid for h in first.hosts]


def test_up_with_another_size_says_to_run_down_first(testbed):
    testbed(nodes=3)
    with pytest.raises(tb.TestbedError, match="down"):
        tb.up(2, False)
    proc = cli("up", "--nodes", "2")
    assert proc.returncode != 0
    assert "run `testbed.py down` first" in proc.stderr
    with pytest.raises(tb.TestbedError, match="down"):
        tb.up(3, True)


def test_status_and_exec_commands(testbed):
    testbed(nodes=3)
    status = cli("status")
    assert status.returncode == 0, status.stderr
    for name in ("node0", "node1", "node2"):
        assert name in status.stdout
    assert status.stdout.count("running") + status.stdout.count("degraded") == 3
    proc = cli("exec", "node1", "--", "hostname")
    assert (proc.returncode, proc.stdout.strip()) == (0, "node1")


def test_down_leaves_nothing_and_down_again_is_fine(testbed):
    testbed(nodes=3)
    running = tb.leaks()  # while up, leaks() lists what the testbed holds
    for item in ("network namespace sl-node0", "link slbr0", "link sl-node2"):
        assert item in running
    assert any(item.startswith("process ") for item in running)
    assert any(item.startswith("mount /var/lib/shadowline-testbed/") for item in running)
    tb.down()
    assert tb.leaks() == []
    assert not tb.INVENTORY.exists() and not tb.STATE_JSON.exists()
    tb.down()
    assert tb.leaks() == []


def test_down_when_nothing_is_up():
    tb.down()
    assert tb.leaks() == []
    proc = cli("down")
    assert proc.returncode == 0, proc.stderr
    proc = cli("leaks")
    assert (proc.returncode, proc.stdout.strip()) == (0, "no leaks")


def fail(*_args, **_kw):
    raise tb.TestbedError("injected failure")


def test_a_failed_up_cleans_up_after_itself(monkeypatch):
    tb.down()
    monkeypatch.setattr(tb_boot, "wait_sshd", fail)  # boot() waits for sshd (testbed/boot.py)
    with pytest.raises(tb.TestbedError, match="injected"):
        tb.up(2, False)
    assert tb.leaks() == []


def test_down_after_an_up_that_died_half_way(monkeypatch):
    tb.down()
    real_launch = tb.launch_host

    def launch_one_then_fail(host):
        if host.index == 1:
            fail()
        real_launch(host)

    monkeypatch.setattr(tb_boot, "launch_host", launch_one_then_fail)
    with pytest.raises(tb.TestbedError, match="injected"):
        tb.up(3, False, keep_on_failure=True)
    left = tb.leaks()
    assert "network namespace sl-node2" in left and any(item.startswith("process ") for item in left)
    tb.down()
    assert tb.leaks() == []


def test_down_finds_hosts_without_its_journal():
    tb.down()
    tb.up(2, False)
    tb.JOURNAL.unlink()
    tb.down()
    assert tb.leaks() == []


def test_command_line_up_and_down():
    tb.down()
    up = cli("up", "--nodes", "1")
    assert up.returncode == 0, up.stderr
    assert "booted 1 hosts" in up.stdout and "node0" in up.stdout
    down = cli("down")
    assert down.returncode == 0, down.stderr
    leaks = cli("leaks")
    assert (leaks.returncode, leaks.stdout.strip()) == (0, "no leaks")
