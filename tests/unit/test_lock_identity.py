"""What the failover lock really is (common/lock_identity.py): /proc/locks as the kernel writes it, against real
flocks taken here, and a lock file deleted while held (fault matrix row 11 in small)."""

from __future__ import annotations

import fcntl
import os

from shadowline.common.lock_identity import FileId, flocks, parse_proc_locks, path_id


def test_proc_locks_lines_granted_and_waiting():
    text = ("1: FLOCK  ADVISORY  WRITE 4242 00:2d:1234 0 EOF\n"
            "1: -> FLOCK  ADVISORY  WRITE 4343 00:2d:1234 0 EOF\n"
            "2: POSIX  ADVISORY  WRITE 77 08:01:99 0 EOF\n"
            "3: FLOCK  ADVISORY  READ 88 fd:00:5 0 EOF\n")
    held, waiting, shared = parse_proc_locks(text)
    assert (held.pid, held.file, held.write, held.waiting) == (4242, FileId(os.makedev(0, 0x2d), 1234), True, False)
    assert (waiting.pid, waiting.waiting) == (4343, True)
    assert (shared.pid, shared.write, shared.file.device) == (88, False, os.makedev(0xfd, 0))


def test_a_lock_file_deleted_while_held_is_seen_for_what_it_is(tmp_path):
    path = str(tmp_path / "failover.lock")
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = path_id(path)
        assert any(lock.file == held and lock.pid == os.getpid() and lock.write for lock in flocks())
        os.unlink(path)  # deleted while held: the lock stays on a file no path names
        assert path_id(path) is None
        assert any(lock.file == held and lock.pid == os.getpid() for lock in flocks())
        other = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)  # the next engine to open the path...
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ...wins a new file's lock at once: two holders
            assert path_id(path) != held
        finally:
            os.close(other)
    finally:
        os.close(fd)
