"""shadowline.common.events: the one event log schema the agent and the Slurm supervisor write, and its reader."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from shadowline.common.events import ERR, INFO, WARNING, EventLog, human_line, read_events

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


# -- the journal ---------------------------------------------------------------------------------------------- #

def parse_datagram(data: bytes) -> dict[str, str]:
    """journald's native protocol, read as journald reads it (KEY=value lines, or KEY, a length and binary data)."""
    fields: dict[str, str] = {}
    while data:
        head, sep, rest = data.partition(b"\n")
        assert sep, data
        if b"=" in head:
            key, _unused, value = head.partition(b"=")
            fields[key.decode()] = value.decode()
            data = rest
        else:
            (size,) = struct.unpack("<Q", rest[:8])
            fields[head.decode()] = rest[8:8 + size].decode()
            assert rest[8 + size:9 + size] == b"\n"
            data = rest[9 + size:]
    return fields


@pytest.fixture()
def journal(tmp_path: Path):
    path = str(tmp_path / "journal.socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    yield path, sock
    sock.close()


def test_each_event_goes_to_the_journal_with_its_fields(tmp_path: Path, journal):
    path, sock = journal
    log = EventLog(str(tmp_path / "events.jsonl"), "node1", deployment="demo", journal=path)
    log.write("failure-declared", 0, 3, reason="rank-exited")
    log.write("launch-failed", 1, 4, status="line one\nline two")
    log.write("agent-started", pid=7)
    declared, failed, started = (parse_datagram(sock.recv(65536)) for _unused in range(3))
    assert declared == {
        "MESSAGE": 'shadowline cohort 0 gen 3: failure-declared {"reason": "rank-exited"}',
        "PRIORITY": str(WARNING), "SYSLOG_IDENTIFIER": "shadowline", "SHADOWLINE_EVENT": "failure-declared",
        "SHADOWLINE_COHORT": "0", "SHADOWLINE_GENERATION": "3", "SHADOWLINE_NODE": "node1",
        "SHADOWLINE_DEPLOYMENT": "demo", "SHADOWLINE_DETAIL": '{"reason": "rank-exited"}'}
    assert failed["PRIORITY"] == str(ERR) and json.loads(failed["SHADOWLINE_DETAIL"]) == {
        "status": "line one\nline two"}
    assert started["PRIORITY"] == str(INFO) and "SHADOWLINE_COHORT" not in started
    assert [e["event"] for e in read_events(str(tmp_path / "events.jsonl"))] == [
        "failure-declared", "launch-failed", "agent-started"]  # the file has them too


def test_a_value_with_a_newline_is_sent_in_the_binary_form(tmp_path: Path, journal):
    path, sock = journal
    EventLog(str(tmp_path / "events.jsonl"), "node0", journal=path).write("x", when=1.0, note="a")
    raw = sock.recv(65536)
    assert raw.startswith(b"MESSAGE=") and b"SHADOWLINE_DEPLOYMENT" not in raw
    from shadowline.common.events import journal_datagram
    binary = journal_datagram({"MESSAGE": "one\ntwo", "PRIORITY": "6"})
    assert binary == b"MESSAGE\n" + struct.pack("<Q", 7) + b"one\ntwo\nPRIORITY=6\n"
    assert parse_datagram(binary) == {"MESSAGE": "one\ntwo", "PRIORITY": "6"}


def test_no_journal_socket_is_no_error(tmp_path: Path):
    log = EventLog(str(tmp_path / "events.jsonl"), "node0", journal=str(tmp_path / "absent.socket"))
    log.write("rank-exited", 0, 1)
    full = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # bound but never read: it fills up, writes go on
    full.bind(str(tmp_path / "full.socket"))
    busy = EventLog(str(tmp_path / "events.jsonl"), "node0", journal=str(tmp_path / "full.socket"))
    started = time.monotonic()
    for i in range(2000):
        busy.write("tick", 0, i, payload="z" * 1000)
    full.close()
    assert time.monotonic() - started < 10  # never blocked on the journal
    assert len(list(read_events(str(tmp_path / "events.jsonl")))) == 2001


# -- rotation ------------------------------------------------------------------------------------------------- #

def test_the_file_is_rotated_by_size_keeping_three_and_readers_miss_no_line(tmp_path: Path):
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path), "node0", journal=None, rotate_bytes=4096)
    for i in range(100):
        log.write("tick", 0, i, payload="p" * 200)  # about 300 bytes a line: 13 a file
    sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir() if p.name.startswith("events.jsonl")}
    assert set(sizes) == {"events.jsonl", "events.jsonl.1", "events.jsonl.2", "events.jsonl.3", "events.jsonl.lock"}
    assert all(size <= 4096 for name, size in sizes.items())
    kept = [r["generation"] for r in read_events(str(path))]
    assert kept == list(range(100 - len(kept), 100)) and len(kept) > 3 * 12  # in order, the oldest gone
    since = time.time()
    time.sleep(0.01)
    for i in range(100, 130):  # the drills' reading: from a fault's time on, across a rotation
        log.write("tick", 0, i, payload="p" * 200)
    assert [r["generation"] for r in read_events(str(path), since)] == list(range(100, 130))


def test_writers_of_several_processes_rotate_once_and_keep_every_line(tmp_path: Path):
    path = str(tmp_path / "events.jsonl")

    def write(node: str) -> None:
        log = EventLog(path, node, journal=None, rotate_bytes=200_000)
        for i in range(300):
            log.write("tick", 0, i, payload="q" * 200)

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=write, args=(f"proc{n}",)) for n in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert all(p.exitcode == 0 for p in procs)
    records = list(read_events(path))
    assert len(records) == 900  # about 270 kB in all: one rotation, nothing lost or torn
    assert os.path.exists(path + ".1") and not os.path.exists(path + ".2")
