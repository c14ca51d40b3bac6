"""Bounded polling (cluster/waits.py): a wait whose process has ended stops at once instead of waiting out its
timeout (wait_ready's ``unit``: an engine that refused its arguments is reported in about a second, not after the
progress slice of 15 s)."""

from __future__ import annotations

import subprocess
import sys
import time

from shadowline.cluster.waits import every, http_check, poll
from tests.loopback import free_port


def test_a_wait_stops_once_the_process_that_would_answer_has_ended():
    port = free_port()  # nothing listens there: the check is never ready
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    try:
        start = time.monotonic()
        ready, waited, seen = poll(http_check(f"http://127.0.0.1:{port}/health", timeout_s=0.2), 10, 0.05,
                                   hopeless=lambda: process.poll() is not None)
        elapsed = time.monotonic() - start
    finally:
        process.kill()
        process.wait()
    assert not ready and "did not answer" in seen
    assert 0.25 <= waited < 2.0 and elapsed < 2.0, f"waited {waited:.2f} s for a process that ended after 0.3 s"


def test_without_hope_asked_a_wait_runs_to_its_timeout():
    ready, waited, _seen = poll(lambda: "not yet", 0.3, 0.05)
    assert not ready and waited >= 0.3


def test_every_asks_at_most_once_per_period():
    asked = []
    question = every(0.2, lambda: asked.append(time.monotonic()) is None)
    deadline = time.monotonic() + 0.5
    answers = []
    while time.monotonic() < deadline:
        answers.append(question())
        time.sleep(0.01)
    assert 2 <= len(asked) <= 3, asked  # at 0, 0.2 and maybe 0.4 s
    assert answers.count(True) == len(asked)
