"""The structured event log: JSON lines (time, node, cohort, generation, event, detail) that the agent,
the Slurm supervisor, status and drills write and read."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Iterator


class EventLog:
    def __init__(self, path: str, node: str) -> None:
        self.path = path
        self.node = node
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    def write(self, event: str, cohort: int | None = None, generation: int | None = None,
              **detail: Any) -> dict[str, Any]:
        record = {"time": time.time(), "node": self.node, "cohort": cohort, "generation": generation,
                  "event": event, "detail": detail}
        line = json.dumps(record, sort_keys=True) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        try:
            os.write(fd, line.encode())  # one write of one line: appends from several writers never interleave
        finally:
            os.close(fd)
        return record


def read_events(path: str, since: float = 0.0) -> Iterator[dict[str, Any]]:
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
