"""How the agent waits while its ranks are torn down: the kernel wakes it as a unit's cgroup empties (cgroup v2's
cgroup.events, polled for POLLPRI), so no agent reads its cgroups every 5 ms on the CPUs the dying processes
need; where that cannot be watched, the loop reads the cgroup every TEARDOWN_TICK_S as before."""

from __future__ import annotations

import os
import select
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from shadowline.common.proc import CGROUP2_ROOTS, cgroup_events, cgroup_populated
from shadowline.control.agent import TEARDOWN_TICK_S, TICK_S, teardown_wait_s
from shadowline.control.memory import Teardown

from .test_agent_node import rank

NOW = 1000.0


def teardown(kill_at: float = NOW + 5.0) -> Teardown:
    return Teardown(rank=rank(), since=0.0, kill_at=kill_at, killed=True)


def test_a_watched_teardown_lets_the_loop_sleep_a_whole_tick():
    assert teardown_wait_s({}, {}, NOW) == TICK_S
    assert teardown_wait_s({0: teardown()}, {0: True}, NOW) == TICK_S


def test_an_unwatched_or_already_empty_cgroup_is_read_every_teardown_tick():
    assert teardown_wait_s({0: teardown()}, {}, NOW) == TEARDOWN_TICK_S  # no cgroup.events (cgroup v1 alone)
    assert teardown_wait_s({0: teardown()}, {0: False}, NOW) == TEARDOWN_TICK_S  # emptied before the watch
    assert teardown_wait_s({0: teardown(), 1: teardown()}, {0: True}, NOW) == TEARDOWN_TICK_S


def test_the_wait_ends_at_a_teardowns_kill_time():
    assert teardown_wait_s({0: teardown(NOW + 0.02)}, {0: True}, NOW) == pytest.approx(0.02)
    assert teardown_wait_s({0: teardown(NOW - 1.0)}, {0: True}, NOW) == 0.0  # overdue: at once


def writable_cgroup2() -> Path | None:
    for root in CGROUP2_ROOTS:
        if (Path(root) / "cgroup.procs").exists() and os.access(root, os.W_OK):
            return Path(root)
    return None


def test_the_kernel_wakes_the_wait_as_the_cgroups_last_process_ends():
    """A real cgroup v2 with two processes (a parent and its child); the wait on its cgroup.events sleeps while
    either runs and wakes within a second of the last one's SIGKILL, and the read then says it is empty."""
    root = writable_cgroup2()
    if root is None:
        pytest.skip("no writable cgroup v2 hierarchy here")
    group = root / f"shadowline-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    proc = None
    events = None
    try:
        proc = subprocess.Popen(["sh", "-c", "sleep 30 & exec sleep 30"], preexec_fn=lambda: (  # noqa: PLW1509
            (group / "cgroup.procs").write_text(str(os.getpid()))))
        deadline = time.monotonic() + 5
        while len((group / "cgroup.procs").read_text().split()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        assert len(pids) == 2, pids
        events = cgroup_events("/" + group.name)
        assert events is not None
        assert cgroup_populated(events) is True
        poller = select.poll()
        poller.register(events, select.POLLPRI)
        assert poller.poll(200) == [], "the wait woke while the cgroup's processes ran"
        os.kill(pids[0], 9)
        proc.wait(5)
        assert cgroup_populated(events) is True  # the child still runs
        poller.poll(0)  # the read above armed the next report; any report of the first death is taken here
        cgroup_populated(events)
        os.kill(pids[1], 9)
        killed = time.monotonic()
        assert poller.poll(1000), "the wait did not wake when the cgroup emptied"
        assert time.monotonic() - killed < 1.0
        assert cgroup_populated(events) is False
    finally:
        if events is not None:
            os.close(events)
        for pid in (group / "cgroup.procs").read_text().split() if group.exists() else ():
            os.kill(int(pid), 9)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)
        deadline = time.monotonic() + 5
        while group.exists() and time.monotonic() < deadline:
            try:
                group.rmdir()
            except OSError:  # its last process not reaped yet
                time.sleep(0.05)
    assert not group.exists(), f"{group} left behind"
    assert cgroup_events("/" + group.name) is None  # gone: nothing to watch
