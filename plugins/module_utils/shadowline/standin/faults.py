"""Fault hooks for drills, by signal or by control file.

| fault             | signal  | effect                                                                |
|-------------------|---------|-----------------------------------------------------------------------|
| ``hang``          | SIGUSR1 | freeze the worker and this rank (SIGSTOP): lock kept, /health and     |
|                   |         | serving stop answering, the collective stops; SIGCONT undoes it        |
| ``crash``         | SIGABRT | exit at once with status 134 (the worker dies with the leader)         |
| ``hang-collective`` | SIGUSR2 | stop the heartbeat collective: the other ranks stall, /health stays 200 |
| ``hang-wake``     | (file)  | a parked shadow hangs once it takes the failover lock, before active    |

Control files (for an orchestrator on another host: write one through SSH): a rank polls
``<state dir>/fault-engine-<id>-rank-<r>`` and ``<state dir>/fault-engine-<id>`` (every rank of
that engine on the host) every 0.02 s (a real fault takes effect at once; so, nearly, does a drill's); the
content is the fault's name. A file applies once per
modification and only if written after the rank started, so a leftover file does not hit the next
engine; remove it after the drill.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Callable


def rank_fault_path(engine_id: int | str, node_rank: int, directory: str) -> str:
    """The stand-in rank's fault control file (docs/standin.md; in the failover lock's directory)."""
    return os.path.join(directory, f"fault-engine-{engine_id}-rank-{node_rank}")


log = logging.getLogger("shadowline.standin.faults")

FAULTS = ("hang", "crash", "hang-collective", "hang-wake")
SIGNALS = {signal.SIGUSR1: "hang", signal.SIGABRT: "crash", signal.SIGUSR2: "hang-collective"}


def install(paths: list[str], apply: Callable[[str, str], None]) -> None:
    """Route the fault signals and control files to ``apply(fault, origin)``."""
    for sig, fault in SIGNALS.items():
        signal.signal(sig, lambda signum, _frame, f=fault: apply(f, signal.Signals(signum).name))
    started = time.time()

    def watch() -> None:
        seen: dict[str, int] = {}
        while True:
            for path in paths:
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
                if st.st_mtime < started - 1 or seen.get(path) == st.st_mtime_ns:
                    continue
                seen[path] = st.st_mtime_ns
                try:
                    with open(path, encoding="utf-8") as f:
                        fault = f.read().strip()
                except OSError:
                    continue
                if fault in FAULTS:
                    apply(fault, path)
                else:
                    log.warning("fault file %s: unknown fault %r (known: %s)", path, fault, ", ".join(FAULTS))
            time.sleep(0.02)

    threading.Thread(target=watch, name="fault-watch", daemon=True).start()
