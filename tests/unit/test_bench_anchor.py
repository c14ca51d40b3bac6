"""The Slurm anchor's two programs in scripts/bench-failover, run here as the bench runs them inside the testbed's
hosts: the wait for a process's end (a blocked wait on its pidfd; the poller before it read /proc twice and died
without a word when the process was reaped between the two reads, which dropped the trial) and the rank-sized
task (its processes, threads and memory)."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench-failover"


def program(name: str) -> str:
    """The bench's module-level string ``name``, read without importing the bench (it picks a testbed at import)."""
    for node in ast.parse(BENCH.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} is not in {BENCH}")


def status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


def test_the_wait_wakes_when_the_process_is_killed():
    target = subprocess.Popen(["sleep", "30"])
    waiter = subprocess.Popen([sys.executable, "-c", program("WAIT_GONE"), str(target.pid)], stdout=subprocess.PIPE,
                              text=True)
    try:
        time.sleep(0.3)
        assert waiter.poll() is None, "the wait ended while its process ran"
        killed = time.time()
        target.kill()
        out = waiter.communicate(timeout=10)[0]
        assert killed <= float(out) < killed + 5
    finally:
        target.kill()
        waiter.kill()
        target.wait()
        waiter.wait()


def test_the_wait_answers_for_a_process_already_reaped():
    target = subprocess.Popen(["true"])
    target.wait()  # reaped before the wait starts: it answers at once
    before = time.time()
    done = subprocess.run([sys.executable, "-c", program("WAIT_GONE"), str(target.pid)], capture_output=True,
                          text=True, timeout=10, check=False)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) >= before


def test_the_rank_sized_task_has_the_ranks_processes_threads_and_memory():
    task = subprocess.Popen([sys.executable, "-c", program("RANK_SIZED"), "5:40", "3:24"], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        children: list[int] = []
        while time.monotonic() < deadline:
            main = status(task.pid)
            children = [int(c) for c in Path(f"/proc/{task.pid}/task/{task.pid}/children").read_text().split()]
            # every figure the asserts read, the child's threads too (under load the child's third thread was
            # not started yet when the others were ready)
            if (children and int(main["Threads"]) == 5 and int(main["VmRSS"].split()[0]) >= 38 * 1024
                    and int(status(children[0])["Threads"]) == 3
                    and int(status(children[0])["VmRSS"].split()[0]) >= 22 * 1024):
                break
            time.sleep(0.1)
        main, child = status(task.pid), status(children[0])
        assert int(main["Threads"]) == 5 and int(child["Threads"]) == 3
        assert 38 * 1024 <= int(main["VmRSS"].split()[0]) <= 60 * 1024, main["VmRSS"]
        assert 22 * 1024 <= int(child["VmRSS"].split()[0]) <= 44 * 1024, child["VmRSS"]
    finally:
        os.killpg(task.pid, signal.SIGKILL)
        task.wait()
