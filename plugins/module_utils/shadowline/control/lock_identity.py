"""Which file the failover lock really is: the lock path's inode, and the inodes engines hold flocks on.

A flock belongs to an open file, not to a path. Deleting (or replacing) the lock file while it is held leaves the
holder locking an inode that no path names any more; the next engine to open the path creates a new file and
wins its lock at once: two holders, two active engines. Read-only: /proc/locks names every flock with its pid
and the device:inode it locks, stat names the path's inode.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class FileId:
    device: int  # os.makedev(major, minor)
    inode: int


@dataclass(frozen=True)
class Flock:
    pid: int
    file: FileId
    write: bool  # an exclusive lock (LOCK_EX), as the failover lock is taken
    waiting: bool = False  # blocked, waiting for the lock (a parked shadow)


@dataclass(frozen=True)
class LockSeen:
    """The lock as the driver sees it this tick: the path's file, and which file each cohort's engine holds or
    waits for (engines found by their unit's cgroup)."""
    path: FileId | None
    holders: dict[int, FileId]
    waiting: dict[int, FileId]


def path_id(path: str) -> FileId | None:
    """The lock path's file, None when the path does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return FileId(st.st_dev, st.st_ino)


def parse_proc_locks(text: str) -> list[Flock]:
    """The flocks of /proc/locks, granted and waiting (``->``); POSIX and OFD locks are left out.
    A line: ``1: FLOCK  ADVISORY  WRITE 4242 00:2d:1234 0 EOF`` (a waiter: ``1: -> FLOCK ...``)."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        waiting = len(fields) > 1 and fields[1] == "->"
        if waiting:
            fields = fields[:1] + fields[2:]
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            found.append(Flock(pid, FileId(os.makedev(int(major, 16), int(minor, 16)), int(inode)),
                               fields[3] == "WRITE", waiting))
        except ValueError:
            continue
    return found


def flocks() -> list[Flock]:
    try:
        with open("/proc/locks", encoding="ascii") as handle:
            return parse_proc_locks(handle.read())
    except OSError:
        return []


ENGINE_UNIT = re.compile(r"-engine@(\d+)\.service")


def cohort_of(pid: int, deployment_unit_prefix: str) -> int | None:
    """The cohort whose engine unit runs ``pid`` (from its cgroup), None for any other process."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    for line in text.splitlines():
        path = line.rsplit(":", 1)[-1]
        match = ENGINE_UNIT.search(path)
        if match and deployment_unit_prefix + "-engine@" in path:
            return int(match.group(1))
    return None


def lock_seen(path: str, deployment_unit_prefix: str) -> LockSeen:
    holders: dict[int, FileId] = {}
    waiting: dict[int, FileId] = {}
    for lock in flocks():
        if not lock.write:
            continue
        cohort = cohort_of(lock.pid, deployment_unit_prefix)
        if cohort is not None:
            (waiting if lock.waiting else holders)[cohort] = lock.file
    return LockSeen(path_id(path), holders, waiting)
