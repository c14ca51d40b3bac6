"""The job's record: ``events.jsonl`` (one JSON object per line) and ``job.json`` (ids, nodes, steps), in the
job's output directory.

Every event has ``time`` (ISO 8601 UTC, ms), ``unix`` (seconds), ``node`` (where it happened), ``cohort`` and
``generation`` (null when not about a cohort step), ``event`` and ``detail`` (an object).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any


def iso(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix)) + f".{int(unix * 1000) % 1000:03d}Z"


class EventLog:
    def __init__(self, path: str, echo: bool = True) -> None:
        self.path, self.echo = path, echo
        self.node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self._lock = threading.Lock()

    def write(self, event: str, cohort: int | None = None, generation: int | None = None, node: str | None = None,
              when: float | None = None, **detail: Any) -> dict[str, Any]:
        unix = time.time() if when is None else when
        record = {"time": iso(unix), "unix": round(unix, 3), "node": node or self.node, "cohort": cohort,
                  "generation": generation, "event": event, "detail": detail}
        line = json.dumps(record, sort_keys=True)
        with self._lock:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
            if self.echo:
                where = f" cohort {cohort}" + (f" gen {generation}" if generation is not None else "") \
                    if cohort is not None else ""
                print(f"{record['time']} shadowline{where}: {event} {json.dumps(detail, sort_keys=True)}", flush=True)
        return record


def read_events(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def write_json(path: str, data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
