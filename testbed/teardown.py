"""Teardown: kill every process of the testbed, then remove its network, mounts, cgroups, state and files."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time

from .boot import launchers
from .cgroups import cgroup_pids, in_testbed_cgroup, remove_cgroups, testbed_cgroup_dirs
from .errors import TestbedError
from .helpers import pid_alive, wait_until
from .inventory import remove_outputs
from .journal import State, load_journal
from .mounts import unmount_all
from .names import KILL_TIMEOUT, STATE_ROOT
from .network import delete_network, netns_pids


def kill_everything(state: State | None) -> None:
    """SIGKILL each host's systemd (the kernel then kills its PID namespace), then anything else of the testbed.

    The launchers (unshare) are left to reap their systemd and exit by themselves: killing them first would
    leave systemd's zombie to the machine's PID 1."""
    pid1s = [h.pid for h in state.hosts if pid_alive(h.pid) and in_testbed_cgroup(h.pid)] if state else []
    for pid in pid1s:  # checked above: never a reused pid of someone else
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(TestbedError):  # whatever is left is swept below
        wait_until("the hosts' systemd to exit", 5, lambda: not any(pid_alive(p) for p in pid1s), 0.005)

    def gone() -> bool:
        for name, proc in list(launchers.items()):
            if proc.poll() is not None:
                del launchers[name]
        pids = {p for p in cgroup_pids(testbed_cgroup_dirs()) | netns_pids() if pid_alive(p)}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return not pids and not launchers

    wait_until("the testbed's processes to exit", KILL_TIMEOUT, gone, 0.01)


def down_locked() -> float:
    started = time.monotonic()
    state = load_journal()
    kill_everything(state)
    delete_network(state)
    unmount_all()
    stuck = remove_cgroups()
    shutil.rmtree(STATE_ROOT, ignore_errors=True)
    remove_outputs()
    if stuck:
        raise TestbedError(f"cgroups that would not go: {stuck}")
    return time.monotonic() - started
