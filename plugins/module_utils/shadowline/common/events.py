"""The structured event log: JSON lines that the agent, the Slurm supervisor, status and drills write and read.

One schema everywhere (the agent's ``events.jsonl`` in its state directory, the Slurm job's ``events.jsonl`` in
the job directory): ``time`` (unix seconds, a float), ``node`` (where it happened), ``cohort`` and
``generation`` (null when not about a cohort), ``event`` and ``detail`` (an object).

Each event also goes to the systemd journal, with the fields ``journal_fields`` lists (``journalctl -u
shadowline-<deployment>-agent SHADOWLINE_EVENT=failure-declared``), through journald's native protocol: one
datagram to ``/run/systemd/journal/socket`` (stdlib only; skipped without a word where there is no journal, as
under Slurm on some nodes). The file is rotated by size (``events.jsonl.1`` .. ``.3``, at 64 MiB);
``read_events`` reads the rotated files too, so a reader that asks from a time misses no line.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import threading
import time
from typing import Any, Iterator

from . import console

JOURNAL_SOCKET = "/run/systemd/journal/socket"
ROTATE_BYTES = 64 * 1024 * 1024  # events.jsonl is rotated when a line would take it past this
KEEP = 3  # rotated files kept: events.jsonl.1 (the newest) .. events.jsonl.3
# journald's priorities (syslog's): what needs a person's attention stands out in `journalctl -p warning`.
ERR, WARNING, INFO = 3, 4, 6
ERRORS = {"fatal", "gave-up", "slot-dead", "launch-failed", "ranks-not-gone", "promotion-unverified",
          "gms-degraded", "gms-lost-unreported", "revoke-failed"}
WARNINGS = {"failure-declared", "rank-exited", "fenced", "agent-lost", "agent-lease-expired", "etcd-unreachable",
            "gms-lost", "lock-taken-by-failing", "lock-unknown-holder", "not-serving", "serving-silent",
            "promotion-abandoned", "launch-abandoned", "model-not-ready", "watchdog-hang-detected"}


class EventLog:
    """Appends one JSON line per event to ``path``, in one ``write`` on an ``O_APPEND`` descriptor, so lines of
    several writers (processes or threads) never interleave, and sends it to the journal (``journal``: the
    socket, None for none). ``echo`` also prints a readable line per event on stdout (the Slurm job's output).
    ``deployment`` goes to the journal's SHADOWLINE_DEPLOYMENT."""

    def __init__(self, path: str, node: str, echo: bool = False, mode: int = 0o640, *,  # noqa: PLR0913 (over the size limits of pyproject.toml; keyword-only settings)
                 deployment: str = "", journal: str | None = JOURNAL_SOCKET, rotate_bytes: int = ROTATE_BYTES) -> None:
        self.path, self.node, self.echo, self.mode = path, node, echo, mode
        self.deployment, self.journal, self.rotate_bytes = deployment, journal, rotate_bytes
        self._lock = threading.Lock()  # keeps the echoed lines in the order of the file's
        self._socket: socket.socket | None = None
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    def write(self, event: str, cohort: int | None = None, generation: int | None = None, *,
              node: str | None = None, when: float | None = None, **detail: Any) -> dict[str, Any]:
        """Record ``event``; ``node`` (default: this log's) is where it happened, ``when`` (default: now) the
        unix time it happened at, as for events copied from another process's output."""
        record = {"time": time.time() if when is None else when, "node": node or self.node, "cohort": cohort,
                  "generation": generation, "event": event, "detail": detail}
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with self._lock:
            fd = self._open_for(len(line))
            try:
                os.write(fd, line)  # one write of one line: appends from several writers never interleave
            finally:
                os.close(fd)
            if self.echo:
                console.out(human_line(record), flush=True)
            self._to_journal(record)
        return record

    def _open_for(self, size: int) -> int:
        """The current file, opened to append; rotated first when ``size`` more bytes would pass the limit. Of
        several writers at the limit, the one holding the rotation lock renames; the others then append to the
        new file (a writer that opened the old one just before the rename appends there: ``.1`` keeps it)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, self.mode)
        if os.fstat(fd).st_size + size <= self.rotate_bytes:
            return fd
        os.close(fd)
        lock = os.open(self.path + ".lock", os.O_WRONLY | os.O_CREAT, self.mode)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = os.stat(self.path).st_size
            except FileNotFoundError:
                current = 0
            if current + size > self.rotate_bytes and current > 0:  # not rotated by another writer meanwhile
                for n in range(KEEP - 1, 0, -1):
                    if os.path.exists(f"{self.path}.{n}"):
                        os.replace(f"{self.path}.{n}", f"{self.path}.{n + 1}")
                os.replace(self.path, f"{self.path}.1")
            return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, self.mode)
        finally:
            os.close(lock)  # closing releases the lock

    def _to_journal(self, record: dict[str, Any]) -> None:
        """One datagram of journald's native protocol; nothing when there is no journal or it refuses."""
        if self.journal is None:
            return
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._socket.setblocking(False)  # a journald that lags drops the entry; it never stalls the agent
            self._socket.sendto(journal_datagram(journal_fields(record, self.deployment)), self.journal)
        except OSError:
            pass  # no journal here (FileNotFoundError), or it is busy or the entry too large: the file has it


def journal_fields(record: dict[str, Any], deployment: str = "") -> dict[str, str]:
    """The journal entry of an event: MESSAGE (the readable line, without its time: the journal has one),
    PRIORITY, SYSLOG_IDENTIFIER, and SHADOWLINE_EVENT, _COHORT, _GENERATION, _NODE, _DEPLOYMENT (those of the
    event that are set); the detail is in MESSAGE and SHADOWLINE_DETAIL (JSON)."""
    event = str(record["event"])
    fields = {"MESSAGE": human_line(record).split(" ", 1)[1], "PRIORITY": str(priority(event)),
              "SYSLOG_IDENTIFIER": "shadowline", "SHADOWLINE_EVENT": event, "SHADOWLINE_NODE": str(record["node"]),
              "SHADOWLINE_DETAIL": json.dumps(record.get("detail") or {}, sort_keys=True)}
    if record.get("cohort") is not None:
        fields["SHADOWLINE_COHORT"] = str(record["cohort"])
    if record.get("generation") is not None:
        fields["SHADOWLINE_GENERATION"] = str(record["generation"])
    if deployment:
        fields["SHADOWLINE_DEPLOYMENT"] = deployment
    return fields


def priority(event: str) -> int:
    """The journal priority of an event: errors (a person must act), warnings (a failure handled), else info."""
    if event in ERRORS or event.endswith("-error"):
        return ERR
    return WARNING if event in WARNINGS else INFO


def journal_datagram(fields: dict[str, str]) -> bytes:
    """journald's native format: ``KEY=value\\n``, or for a value with a newline ``KEY\\n``, its length as a
    little-endian 64-bit integer, the value and ``\\n``."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode()
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


def human_line(record: dict[str, Any]) -> str:
    """One readable line: ``2026-11-22T09:15:44.123Z shadowline cohort 0 gen 2: promoted {...}``."""
    unix = record["time"]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix)) + f".{int(unix * 1000) % 1000:03d}Z"
    cohort, generation = record.get("cohort"), record.get("generation")
    where = "" if cohort is None else f" cohort {cohort}" + ("" if generation is None else f" gen {generation}")
    return f"{stamp} shadowline{where}: {record['event']} {json.dumps(record.get('detail') or {}, sort_keys=True)}"


def read_events(path: str, since: float = 0.0) -> Iterator[dict[str, Any]]:
    """The events of ``path`` at or after the unix time ``since``, in file order, starting with the rotated
    files written to since then (oldest first); unreadable lines are skipped."""
    for name in [f"{path}.{n}" for n in range(KEEP, 0, -1)] + [path]:
        try:
            if name != path and os.stat(name).st_mtime < since:
                continue  # its last line was written before `since`
            with open(name, encoding="utf-8") as handle:
                for line in handle:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if record.get("time", 0) >= since:
                        yield record
        except FileNotFoundError:
            continue
