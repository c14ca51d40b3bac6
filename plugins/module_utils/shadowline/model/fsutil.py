"""Filesystem helpers for staging: atomic writes, durable renames, directory swap, lock, free space."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import shutil
import stat
import tempfile
from typing import Any


def fsync_dir(path: str) -> None:
    """Flush a directory entry (after a rename or create inside it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str, data: bytes, *, mode: int = 0o644, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so a reader sees either the old or the new content, never a mix."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(directory)


def atomic_write_json(path: str, obj: Any, *, mode: int = 0o644, durable: bool = True) -> None:
    data = (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode("utf-8")
    atomic_write_bytes(path, data, mode=mode, durable=durable)


def read_json(path: str) -> Any:
    with open(path, "rb") as handle:
        return json.loads(handle.read().decode("utf-8"))


def remove_tree(path: str) -> None:
    """Remove a file or directory tree if present."""
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2_exchange(a: str, b: str) -> bool:
    """Atomically exchange two paths with renameat2(RENAME_EXCHANGE). False if unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        func = libc.renameat2
    except (OSError, AttributeError):
        return False
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    func.restype = ctypes.c_int
    rc = func(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), a)


def swap_into_place(new_dir: str, target: str, aside: str) -> None:
    """Put ``new_dir`` at ``target``; an existing ``target`` is removed.

    The target path is never a half-written directory: when it exists it is exchanged atomically
    (renameat2) where the filesystem supports it, else moved to ``aside`` first and then replaced.
    """
    parent = os.path.dirname(target)
    if not os.path.lexists(target):
        os.rename(new_dir, target)
        fsync_dir(parent)
        return
    if _renameat2_exchange(new_dir, target):
        fsync_dir(parent)
        remove_tree(new_dir)  # now holds the old content
        return
    remove_tree(aside)
    os.rename(target, aside)
    os.rename(new_dir, target)
    fsync_dir(parent)
    remove_tree(aside)


# Staged models are read by the engines' unprivileged service user: whatever the umask of the run, every
# directory shadowline creates is 0755 and every staged file 0644 (see make_tree_readable).
DIR_MODE = 0o755
FILE_MODE = 0o644


def makedirs_readable(path: str, mode: int = DIR_MODE) -> None:
    """``os.makedirs(path, exist_ok=True)``; the directories it creates get ``mode`` exactly (not umask-reduced)."""
    path = os.path.abspath(path)
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
            continue
        os.chmod(directory, mode)


def make_tree_readable(root: str) -> int:
    """Directories 0755 and regular files 0644 below (and including) ``root``; returns how many were changed.

    Only entries whose mode differs are touched (a chmod changes the ctime that fast verification compares).
    Symlinks are left alone.
    """
    changed = 0
    for dirpath, _dirnames, filenames in os.walk(root):
        for name, mode in [(dirpath, DIR_MODE)] + [(os.path.join(dirpath, f), FILE_MODE) for f in filenames]:
            st = os.lstat(name)
            if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) != mode:
                os.chmod(name, mode)
                changed += 1
    return changed


def nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_bytes(path: str) -> int:
    """Bytes available to this user on the filesystem that holds (or would hold) ``path``."""
    return shutil.disk_usage(nearest_existing(path)).free


def human_bytes(n: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    value = float(n)
    for unit in units:
        if abs(value) < 1024 or unit == units[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"


class DirLock:
    """An exclusive, non-blocking flock on a lock file; released on exit or process death."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> str:
        try:
            with open(self.path, encoding="utf-8") as handle:
                return handle.read().strip() or "unknown"
        except OSError:
            return "unknown"

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
