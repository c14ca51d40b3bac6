"""Keep one node's server running inside its Slurm task: ``python -m shadowline.slurm.keeper [options] -- ARGV``.

The job's GMS servers run as one step on every node, and a step ends only when every task has (without
``--kill-on-bad-exit``, which would empty every node's server for one death). So a server that dies on one node
would stay dead with nothing noticing. The keeper runs the server as its child and starts it again when it ends,
after the delay of the relaunch policy every path shares (common/policy.py ``RelaunchPolicy.after_death``: at once
after a run of ``stable_after_s``, else a backoff that doubles with each quick death in a row; past
``max_relaunch_attempts`` of them it gives up and exits with the server's status). Each start after the first is
a ``SHADOWLINE_EVENT`` line, ``restarted``, which the supervisor turns into ``gms-restarted`` and the writer's
republish (slurm/watch.py): the new server starts empty.

SIGTERM and SIGINT (the step stopped or torn down) are forwarded to the child's process group and end the keeper
once the child has ended: nothing is started again after a stop was asked for.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import threading
import time

from ..common import console
from ..common.policy import RelaunchPolicy
from .watchdog import emit, exit_status, parse_with_command


def log(message: str) -> None:
    console.err(f"shadowline.slurm.keeper[{os.getpid()}]: {message}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m shadowline.slurm.keeper",
                                description="Run a server; start it again when it ends, by the shared relaunch policy.")
    p.add_argument("--backoff", type=float, required=True, help="gms_failover.relaunch_backoff_s")
    p.add_argument("--backoff-max", type=float, required=True, help="gms_failover.relaunch_backoff_max_s")
    p.add_argument("--max-attempts", type=int, required=True, help="gms_failover.max_relaunch_attempts")
    p.add_argument("--stable-after", type=float, required=True, help="gms_failover.stable_after_s")
    return parse_with_command(p, argv, "server")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    policy = RelaunchPolicy(backoff_s=args.backoff, backoff_max_s=args.backoff_max, max_attempts=args.max_attempts,
                            stable_after_s=args.stable_after)
    stopping = threading.Event()
    child: list[subprocess.Popen] = []  # the running server, for the signal handler (one at a time)

    def forward(signum: int, _frame: object) -> None:
        stopping.set()
        if child and child[-1].poll() is None:
            try:
                os.killpg(child[-1].pid, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    attempts, starts, status = 0, 0, 0
    while not stopping.is_set():
        started = time.monotonic()
        child[:] = [subprocess.Popen(args.command, process_group=0)]
        if stopping.is_set():  # a stop that came while it started: the handler saw no running child
            os.killpg(child[-1].pid, signal.SIGTERM)
        starts += 1
        if starts > 1:
            emit("restarted", pid=child[-1].pid, attempts=attempts)
        status = exit_status(child[-1].wait())
        if stopping.is_set():
            return status
        ran_s = time.monotonic() - started
        decision = policy.after_death(attempts, ran_s)
        attempts = decision.attempts
        log(f"the server (pid {child[-1].pid}) ended with status {status} after {ran_s:.1f} s")
        if decision.gives_up:
            emit("gave-up", status=status, attempts=attempts)
            return status
        emit("ended", status=status, attempts=attempts, delay_s=round(decision.delay_s, 3))
        stopping.wait(decision.delay_s)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
