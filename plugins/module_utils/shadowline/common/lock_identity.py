"""Which file the failover lock really is: the lock path's inode, and the inodes engines hold flocks on.

A flock belongs to an open file, not to a path. Deleting (or replacing) the lock file while it is held leaves the
holder locking an inode that no path names any more; the next engine to open the path creates a new file and
wins its lock at once: two holders, two active engines. Read-only: /proc/locks names every flock with its pid
and the device:inode it locks, stat names the path's inode.
"""

from __future__ import annotations

import os
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
    """The lock as the driver sees it this tick: the path's file, which file each cohort's engine holds, and which
    file a cohort that holds none has open (it polls that file's lock: a parked shadow)."""
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


def opened(pids: list[int], path: str) -> FileId | None:
    """The file at ``path`` (or that was there: a deleted one) that one of ``pids`` has open, from /proc/<pid>/fd:
    a parked shadow polls the lock with LOCK_NB on a descriptor it keeps, so it never shows as a waiter."""
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            link = f"/proc/{pid}/fd/{fd}"
            try:
                target = os.readlink(link)
                if target != path and target != f"{path} (deleted)":
                    continue
                st = os.stat(link)
            except OSError:
                continue
            return FileId(st.st_dev, st.st_ino)
    return None


def lock_seen(path: str, engines: dict[int, list[int]]) -> LockSeen:
    """``engines``: each cohort's processes on this node (its unit's cgroup)."""
    owner = {pid: cohort for cohort, pids in engines.items() for pid in pids}
    holders: dict[int, FileId] = {}
    for lock in flocks():
        cohort = owner.get(lock.pid)
        if cohort is not None and lock.write and not lock.waiting:
            holders[cohort] = lock.file
    waiting: dict[int, FileId] = {}
    for cohort, pids in engines.items():
        if cohort not in holders and (file := opened(pids, path)) is not None:
            waiting[cohort] = file
    return LockSeen(path_id(path), holders, waiting)
