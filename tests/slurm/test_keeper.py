"""slurm/keeper.py: a server that ends is started again by the shared relaunch policy (at once after a stable run,
after a growing delay in a crash loop, given up past max_relaunch_attempts), each start after the first reported
as a SHADOWLINE_EVENT line; a stop (SIGTERM) reaches the server and starts nothing again. Real processes, no Slurm."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shadowline.common.policy import REPUBLISH, REPUBLISH_DEGRADED, REPUBLISH_UNDER_WAY, republish_choice
from shadowline.slurm.watchdog import EVENT_PREFIX

pytestmark = pytest.mark.timeout(60)


def keeper(*command: str, max_attempts: int = 2, stable_after: float = 30.0) -> list[str]:
    return [sys.executable, "-m", "shadowline.slurm.keeper", "--backoff", "0.2", "--backoff-max", "0.4",
            "--max-attempts", str(max_attempts), "--stable-after", f"{stable_after:g}", "--", *command]


def events(stderr: str) -> list[dict]:
    return [json.loads(line.split(EVENT_PREFIX, 1)[1]) for line in stderr.splitlines() if EVENT_PREFIX in line]


def test_a_crash_loop_is_started_again_with_a_growing_delay_then_given_up(tmp_path: Path):
    starts = tmp_path / "starts"
    started = time.monotonic()
    proc = subprocess.run(keeper("sh", "-c", f"echo x >> {starts}; exit 3"), capture_output=True, text=True,
                          timeout=30, check=False)
    took = time.monotonic() - started
    assert proc.returncode == 3, proc.stderr
    assert len(starts.read_text().splitlines()) == 3  # the first start and two more: max_relaunch_attempts 2
    kinds = [(e["event"], e["detail"].get("attempts"), e["detail"].get("delay_s")) for e in events(proc.stderr)]
    assert kinds == [("ended", 1, 0.2), ("restarted", 1, None), ("ended", 2, 0.4), ("restarted", 2, None),
                     ("gave-up", 3, None)]
    assert 0.6 <= took < 10  # the delays of the policy: 0.2 s, then 0.4 s


def test_a_server_that_ran_stably_is_started_again_at_once(tmp_path: Path):
    """Every run is longer than stable_after_s: the count never grows, so not even max_attempts 0 gives up."""
    starts = tmp_path / "starts"
    proc = subprocess.Popen(keeper("sh", "-c", f"echo x >> {starts}; sleep 0.3; exit 1", max_attempts=0,
                                   stable_after=0.1), stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    ended = [e["detail"] for e in events(proc.stderr.read()) if e["event"] == "ended"]
    assert len(starts.read_text().splitlines()) >= 3 and len(ended) >= 2
    assert all(d["attempts"] == 0 and d["delay_s"] == 0 for d in ended)


def test_sigterm_reaches_the_server_and_starts_nothing_again(tmp_path: Path):
    starts = tmp_path / "starts"
    proc = subprocess.Popen(keeper("sh", "-c", f"echo x >> {starts}; exec sleep 30"), stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 10
    while not (starts.exists() and starts.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 128 + signal.SIGTERM
    assert len(starts.read_text().splitlines()) == 1
    assert events(proc.stderr.read()) == []


@pytest.mark.parametrize("running, serving, parked, choice", [
    (False, False, False, REPUBLISH_UNDER_WAY),  # the writer relaunches anyway: its start publishes
    (True, False, False, REPUBLISH),  # a parked or waking writer: ending it costs no client anything
    (True, True, True, REPUBLISH),  # the writer serves, a shadow is parked: one planned failover
    (True, True, False, REPUBLISH_DEGRADED),  # nobody could take over: serving is left alone
])
def test_the_republish_choice(running: bool, serving: bool, parked: bool, choice: str):
    assert republish_choice(running, serving, parked) == choice
