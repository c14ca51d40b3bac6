"""shadowline.control.events: the one event log schema the agent and the Slurm supervisor write, and its reader."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from pathlib import Path

from shadowline.control.events import EventLog, human_line, read_events

KEYS = {"time", "node", "cohort", "generation", "event", "detail"}


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_agent_call_writes_the_schema(tmp_path: Path, capsys):
    path = tmp_path / "state" / "events.jsonl"  # the directory is made
    log = EventLog(str(path), "node0")
    before = time.time()
    record = log.write("rank-exited", 0, 3, pid=12)
    log.write("lock-free", previous="engine-0")
    first, second = lines(path)
    assert first == record and set(first) == KEYS
    assert isinstance(first["time"], float) and before <= first["time"] <= time.time()
    assert (first["node"], first["cohort"], first["generation"], first["event"]) == ("node0", 0, 3, "rank-exited")
    assert first["detail"] == {"pid": 12}
    assert (second["cohort"], second["generation"], second["detail"]) == (None, None, {"previous": "engine-0"})
    assert capsys.readouterr().out == ""  # no echo unless asked
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o640 & ~umask


def test_supervisor_call_overrides_node_and_time_and_echoes(tmp_path: Path, capsys):
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path), "batch0", echo=True, mode=0o644)
    when = 1795344139.2069
    record = log.write("watchdog-hang-detected", cohort=1, generation=2, node="node1", when=when, rank=0)
    log.write("job-started", job_id="42")
    copied, own = lines(path)
    assert copied == record and copied["time"] == when and copied["node"] == "node1"
    assert copied["detail"] == {"rank": 0}  # node and when are not details
    assert own["node"] == "batch0" and own["cohort"] is None
    out = capsys.readouterr().out.splitlines()
    assert out[0] == '2026-11-22T10:42:19.206Z shadowline cohort 1 gen 2: watchdog-hang-detected {"rank": 0}'
    assert out[1].endswith(' shadowline: job-started {"job_id": "42"}')
    assert human_line({**own, "cohort": 0}).split(" ", 1)[1].startswith("shadowline cohort 0: job-started")


def _append(path: str, node: str, count: int) -> None:
    log = EventLog(path, node)
    for i in range(count):
        log.write("tick", 0, i, payload="x" * 512)


def test_threads_and_processes_never_interleave_lines(tmp_path: Path):
    path = str(tmp_path / "events.jsonl")
    shared = EventLog(path, "threads")
    threads = [threading.Thread(target=lambda: [shared.write("tick", 1, i, payload="y" * 512) for i in range(200)])
               for _unused in range(4)]
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append, args=(path, f"proc{n}", 200)) for n in range(3)]
    for worker in (*threads, *procs):
        worker.start()
    for worker in (*threads, *procs):
        worker.join(60)
    assert all(p.exitcode == 0 for p in procs)
    records = lines(Path(path))  # every line whole JSON
    assert len(records) == 4 * 200 + 3 * 200
    assert sum(r["node"] == "threads" for r in records) == 800


def test_read_events_since_skips_partial_lines_and_missing_files(tmp_path: Path):
    path = tmp_path / "events.jsonl"
    assert list(read_events(str(path))) == []
    log = EventLog(str(path), "node0")
    log.write("old", when=100.0)
    log.write("new", when=200.0)
    with open(path, "a") as f:
        f.write('{"time": 300.0, "event": "half-writ')
    assert [e["event"] for e in read_events(str(path))] == ["old", "new"]
    assert [e["event"] for e in read_events(str(path), since=150.0)] == ["new"]
