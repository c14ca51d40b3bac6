"""One node's part of a failover drill: ``python -m shadowline.drill.slurm_fault --step J.S ...``, run by the drill
as ``srun --jobid=J --overlap`` with one task on every node of the job.

Each task lists the processes of the cohort's step on its node (``scontrol listpids J.S``), waits until the
agreed start time (so every node watches before the fault), and on the target node injects the fault:

- ``kill``: SIGKILL the engine rank process (``--node-rank R``) of that step;
- ``stop``: SIGSTOP the engine rank's process group (the rank and its Dynamo worker: a hang);
- ``none``: only watch (when the drill triggers the failover itself, e.g. ``scancel J.S``).

Then every task polls (5 ms) until none of the step's processes on its node is left, and prints one JSON line:
``{"node", "target", "fault_at", "first_gone", "all_gone", "pids", "left"}`` (unix times; ``left`` lists what
still ran when the watch timed out: orphans).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import time
from typing import Any

from ..backends import BACKENDS
from ..common import console
from ..common.proc import command_line, running


def step_pids(step: str) -> list[int]:
    """Processes of ``step`` on this node (scontrol listpids, run locally)."""
    out = subprocess.run(["scontrol", "listpids", step], capture_output=True, text=True, timeout=10,
                         check=False).stdout
    pids = []
    for line in out.splitlines()[1:]:
        words = line.split()
        if words and words[0].isdigit() and int(words[0]) != os.getpid():
            pids.append(int(words[0]))
    return pids


def engine_rank(pids: list[int], rank: int) -> int | None:
    """The engine process of node rank ``rank`` among ``pids`` (not its watchdog, not its worker)."""
    for pid in pids:
        argv = command_line(pid)
        if "shadowline.slurm.watchdog" in argv or not any(b.runs(argv) for b in BACKENDS.values()):
            continue
        node_rank = argv[argv.index("--node-rank") + 1] if "--node-rank" in argv[:-1] else "0"
        if node_rank == str(rank):
            return pid
    return None


def run(step: str, target_node: str, rank: int, fault: str, at: float, timeout: float) -> dict[str, Any]:
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    pids = step_pids(step)
    report: dict[str, Any] = {"node": node, "pids": pids, "target": None, "fault_at": None, "first_gone": None,
                              "all_gone": None, "left": []}
    victim = engine_rank(pids, rank) if node == target_node and fault != "none" else None
    if node == target_node and fault != "none" and victim is None:
        report["error"] = f"no engine rank {rank} among the step's processes {pids}"
    victim_argv = " ".join(command_line(victim)[:4]) if victim is not None else ""
    time.sleep(max(0.0, at - time.time()))
    if victim is not None:
        if fault == "kill":
            os.kill(victim, signal.SIGKILL)
        elif fault == "stop":
            os.killpg(os.getpgid(victim), signal.SIGSTOP)
        report["target"] = {"pid": victim, "fault": fault, "argv": victim_argv}
        report["fault_at"] = time.time()
    deadline = time.monotonic() + timeout
    watched = [p for p in pids if p != victim]
    while time.monotonic() < deadline:
        left = [p for p in watched if running(p)]
        now = time.time()
        if report["first_gone"] is None and len(left) < len(watched):
            report["first_gone"] = now
        if not left:
            report["all_gone"] = now
            break
        time.sleep(0.005)
    report["left"] = [{"pid": p, "argv": " ".join(command_line(p)[:6])} for p in watched if running(p)]
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shadowline.drill.slurm_fault")
    p.add_argument("--step", required=True, help="JOB.STEP of the cohort")
    p.add_argument("--target-node", required=True)
    p.add_argument("--rank", type=int, default=0, help="node rank of the engine process to hit")
    p.add_argument("--fault", choices=["kill", "stop", "none"], required=True)
    p.add_argument("--at", type=float, required=True, help="unix time to inject the fault at")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the step's processes to go")
    args = p.parse_args(argv)
    console.out(json.dumps(run(args.step, args.target_node, args.rank, args.fault, args.at, args.timeout)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
