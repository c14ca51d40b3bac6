"""The structured event log: JSON lines that the agent, the Slurm supervisor, status and drills write and read.

One schema everywhere (the agent's ``events.jsonl`` in its state directory, the Slurm job's ``events.jsonl`` in
the job directory): ``time`` (unix seconds, a float), ``node`` (where it happened), ``cohort`` and
``generation`` (null when not about a cohort), ``event`` and ``detail`` (an object).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Iterator


class EventLog:
    """Appends one JSON line per event to ``path``, in one ``write`` on an ``O_APPEND`` descriptor, so lines of
    several writers (processes or threads) never interleave. ``echo`` also prints a readable line per event on
    stdout (the Slurm job's output)."""

    def __init__(self, path: str, node: str, echo: bool = False, mode: int = 0o640) -> None:
        self.path, self.node, self.echo, self.mode = path, node, echo, mode
        self._lock = threading.Lock()  # keeps the echoed lines in the order of the file's
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    def write(self, event: str, cohort: int | None = None, generation: int | None = None, *,
              node: str | None = None, when: float | None = None, **detail: Any) -> dict[str, Any]:
        """Record ``event``; ``node`` (default: this log's) is where it happened, ``when`` (default: now) the
        unix time it happened at, as for events copied from another process's output."""
        record = {"time": time.time() if when is None else when, "node": node or self.node, "cohort": cohort,
                  "generation": generation, "event": event, "detail": detail}
        line = json.dumps(record, sort_keys=True) + "\n"
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, self.mode)
            try:
                os.write(fd, line.encode())  # one write of one line: appends from several writers never interleave
            finally:
                os.close(fd)
            if self.echo:
                print(human_line(record), flush=True)
        return record


def human_line(record: dict[str, Any]) -> str:
    """One readable line: ``2026-11-22T09:15:44.123Z shadowline cohort 0 gen 2: promoted {...}``."""
    unix = record["time"]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix)) + f".{int(unix * 1000) % 1000:03d}Z"
    cohort, generation = record.get("cohort"), record.get("generation")
    where = "" if cohort is None else f" cohort {cohort}" + ("" if generation is None else f" gen {generation}")
    return f"{stamp} shadowline{where}: {record['event']} {json.dumps(record.get('detail') or {}, sort_keys=True)}"


def read_events(path: str, since: float = 0.0) -> Iterator[dict[str, Any]]:
    """The events of ``path`` at or after the unix time ``since``, in file order; unreadable lines are skipped."""
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("time", 0) >= since:
                    yield record
    except FileNotFoundError:
        return
