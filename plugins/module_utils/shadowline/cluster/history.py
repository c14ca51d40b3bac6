"""What the agents decided and what the drills measured, for ``shadowline history``.

Events are the JSON lines of ``events.jsonl`` (common/events.py: the agent's, in the deployment's state
directory, rotated to ``events.jsonl.1`` .. ``.3``; the Slurm job's, in its job directory), read from files
copied here or from the text ``playbooks/history.yml`` prints (the last lines of every node's file). Drill reports
are the JSON files ``playbooks/drill.yml`` writes with ``-e drill_report=PATH`` (drill/report.py).

Every reader raises ``HistoryError`` with one line naming the file (and line) it could not read; nothing else.
"""

from __future__ import annotations

import json
import math
import re
import time
from calendar import timegm
from pathlib import Path
from typing import Any

from ..common.events import KEEP
from ..common.gpu_health import GPU_EVENTS_FILE

EVENTS_FILE = re.compile(r"events\.jsonl(\.[0-9]+)?$")  # events.jsonl, node0-events.jsonl, events.jsonl.2
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class HistoryError(Exception):
    """An input that cannot be read as asked; the message names it."""


# -- when: --since ------------------------------------------------------------------------------------------- #

def parse_since(text: str, now: float | None = None) -> float:
    """The unix time ``--since`` means: a duration back from now (``90s``, ``10m``, ``2h``, ``1d``), an ISO 8601 UTC
    time (``2026-11-22``, ``2026-11-22T09:15``, ``2026-11-22T09:15:44Z``) or unix seconds. ValueError otherwise."""
    text = text.strip()
    relative = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([smhd])", text)
    if relative:
        return (time.time() if now is None else now) - float(relative.group(1)) * UNITS[relative.group(2)]
    if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", text) and len(text.split(".")[0]) > 8:
        return float(text)
    for layout in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return float(timegm(time.strptime(text.rstrip("Z").split(".")[0], layout)))
        except ValueError:
            continue
    raise ValueError(text)


# -- events --------------------------------------------------------------------------------------------------- #

def event_files(path: Path) -> list[Path]:
    """The event files ``--events PATH`` names: the file itself and its rotations beside it (oldest first), or
    every events file under a directory (``*events.jsonl`` and ``.1`` .. ``.3``; not the GPU fault feed)."""
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and EVENTS_FILE.search(p.name)
                       and not p.name.startswith(GPU_EVENTS_FILE))
        if not found:
            raise HistoryError(f"{path} holds no events file (events.jsonl, or *events.jsonl and its rotations)")
        return found
    if not path.exists():
        raise HistoryError(f"{path}: no such file or directory")
    rotated = [Path(f"{path}.{n}") for n in range(KEEP, 0, -1)]
    return [p for p in rotated if p.is_file()] + [path]


def read_event_file(path: Path) -> list[dict[str, Any]]:
    """Every event of one file; a line that is not an event is an error naming the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise HistoryError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    return [event for number, line in enumerate(text.splitlines(), 1) if line.strip()
            for event in [parse_event(line, f"{path} line {number}")]]


def parse_event(line: str, where: str) -> dict[str, Any]:
    """One event line, checked for what the history shows: ``time`` (a number) and ``event`` (a string)."""
    try:
        record = json.loads(line)
    except ValueError:
        raise HistoryError(f"{where} is not JSON: not an events file (the JSON lines of events.jsonl)") from None
    if not isinstance(record, dict) or not isinstance(record.get("event"), str) \
            or not isinstance(record.get("time"), (int, float)) or isinstance(record.get("time"), bool) \
            or not math.isfinite(record["time"]):
        raise HistoryError(f"{where} is not an event (an object with a numeric time and an event name)")
    return record


def read_events_at(path: Path) -> list[dict[str, Any]]:
    return [event for name in event_files(path) for event in read_event_file(name)]


def events_of_text(text: str, where: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The events in the text playbooks/history.yml prints (one JSON line each), and its other lines (a node
    whose file could not be read says so on a line of its own)."""
    events, said = [], []
    for line in text.splitlines():
        if line.lstrip().startswith("{"):
            try:
                events.append(parse_event(line, where))
                continue
            except HistoryError:
                pass
        if line.strip():
            said.append(line.strip())
    return events, said


def select(events: list[dict[str, Any]], since: float | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """In time order (a stable sort: one node's events keep their file order), from ``since``, the last ``limit``;
    an event copied twice (two rotations, two copies of one file) once."""
    seen: set[str] = set()
    unique = []
    for event in events:
        key = json.dumps(event, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(event)
    ordered = sorted((e for e in unique if since is None or e["time"] >= since), key=lambda e: e["time"])
    return ordered[-limit:] if limit else ordered


def reason_of(event: dict[str, Any]) -> str:
    """The event's reason when its detail has one, else its detail compactly (``key=value``)."""
    detail = event.get("detail")
    if not isinstance(detail, dict):
        return "" if detail is None else str(detail)
    if detail.get("reason"):
        rest = {k: v for k, v in detail.items() if k != "reason"}
        return str(detail["reason"]) + (f" ({_compact(rest)})" if rest else "")
    return _compact(detail)


def _compact(detail: dict[str, Any]) -> str:
    return " ".join(f"{k}={v if isinstance(v, (str, int, float)) else json.dumps(v, sort_keys=True)}"
                    for k, v in sorted(detail.items()))


def stamp(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(unix)) + f".{int(unix * 1000) % 1000:03d}"


def event_lines(events: list[dict[str, Any]]) -> list[str]:
    """One line per event: time (UTC), node, cohort/generation, event, reason or detail."""
    rows = [(stamp(e["time"]), str(e.get("node") or "-"), _where(e), e["event"], reason_of(e)) for e in events]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(("time (UTC)", "node", "c/gen", "event"))]
    header = ("time (UTC)", "node", "c/gen", "event", "reason / detail")
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths + [0])).rstrip() for row in [header, *rows]]


def _where(event: dict[str, Any]) -> str:
    cohort, generation = event.get("cohort"), event.get("generation")
    if cohort is None:
        return "-"
    return f"{cohort}/{'-' if generation is None else generation}"
