"""sha256 of model files at disk speed: large buffers, one file per thread (hashlib drops the GIL).

``COUNTERS`` counts every byte hashed in this process, so callers and tests can prove that a fast
re-verification hashed nothing.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
import typing
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

BUF_SIZE = 8 << 20  # 8 MiB reads: few syscalls, still cache friendly
GIT_BLOB_MAX = 64 << 20  # git sha1 is only checked for small (non-LFS) files

ByteCallback = typing.Callable[[int], None]


class _Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.files = 0
        self.bytes = 0

    def add(self, n_bytes: int) -> None:
        with self._lock:
            self.files += 1
            self.bytes += n_bytes

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.files, self.bytes


COUNTERS = _Counters()


def default_workers() -> int:
    """Threads for hashing/copying: enough to keep a NVMe array busy, bounded by the cores."""
    return max(2, min(8, (os.cpu_count() or 2) * 2))


@dataclass(frozen=True)
class FileDigest:
    size: int
    sha256: str
    git_sha1: str | None = None


def _advise_sequential(fd: int) -> None:
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    except (AttributeError, OSError):
        pass


def hash_file(
    path: str,
    *,
    git_blob: bool = False,
    on_bytes: ByteCallback | None = None,
    bufsize: int = BUF_SIZE,
) -> FileDigest:
    """sha256 of a file (and its git blob sha1 when ``git_blob`` and the file is small)."""
    sha = hashlib.sha256()
    buf = bytearray(bufsize)
    view = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as handle:
        fd = handle.fileno()
        _advise_sequential(fd)
        size = os.fstat(fd).st_size
        git = None
        if git_blob and size <= GIT_BLOB_MAX:
            git = hashlib.sha1(usedforsecurity=False)
            git.update(f"blob {size}\0".encode())
        while True:
            n = handle.readinto(view)
            if not n:
                break
            chunk = view[:n]
            sha.update(chunk)
            if git is not None:
                git.update(chunk)
            total += n
            if on_bytes is not None:
                on_bytes(n)
    COUNTERS.add(total)
    return FileDigest(size=total, sha256=sha.hexdigest(), git_sha1=git.hexdigest() if git is not None else None)


def open_regular(path: str) -> int:
    """A read descriptor on ``path`` when it is a regular file; OSError naming the kind otherwise.

    Opened non-blocking first, so a FIFO (or a device that blocks on open) never hangs the caller; the flag
    is cleared once the descriptor is known to be a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file ({file_kind(mode)})", path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def file_kind(mode: int) -> str:
    """What a stat mode names, in words (for refusals)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISLNK, "a symlink"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def copy_and_hash(
    src: str,
    dst: str,
    *,
    on_bytes: ByteCallback | None = None,
    bufsize: int = BUF_SIZE,
    durable: bool = True,
    max_bytes: int | None = None,
) -> FileDigest:
    """Copy ``src`` to ``dst`` in one pass, hashing the bytes as they go; fsync ``dst`` when durable.

    ``src`` must be a regular file (a FIFO, device or socket is refused without blocking); with ``max_bytes``
    the copy stops with an error as soon as the source holds more than that (a file that grows while copied).
    """
    sha = hashlib.sha256()
    buf = bytearray(bufsize)
    view = memoryview(buf)
    total = 0
    with os.fdopen(open_regular(src), "rb", buffering=0) as fin, open(dst, "wb", buffering=0) as fout:
        _advise_sequential(fin.fileno())
        while True:
            n = fin.readinto(view)
            if not n:
                break
            if max_bytes is not None and total + n > max_bytes:
                raise OSError(errno.EFBIG, f"holds more than the {max_bytes} bytes listed", src)
            chunk = view[:n]
            sha.update(chunk)
            written = 0
            while written < n:
                written += fout.write(chunk[written:]) or 0
            total += n
            if on_bytes is not None:
                on_bytes(n)
        if durable:
            os.fsync(fout.fileno())
    COUNTERS.add(total)
    return FileDigest(size=total, sha256=sha.hexdigest())


def map_files(func: Callable[[str], object], items: Iterable[str], workers: int | None = None) -> dict[str, object]:
    """Run ``func`` over items in a thread pool; first exception is raised after all finish."""
    items = list(items)
    if not items:
        return {}
    n = min(workers or default_workers(), len(items))
    if n <= 1:
        return {item: func(item) for item in items}
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="shadowline-hash") as pool:
        futures = {item: pool.submit(func, item) for item in items}
        results: dict[str, object] = {}
        error: BaseException | None = None
        for item, fut in futures.items():
            try:
                results[item] = fut.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                error = error or exc
        if error is not None:
            raise error
        return results


def hash_files(
    root: str,
    relpaths: Iterable[str],
    *,
    workers: int | None = None,
    on_bytes: ByteCallback | None = None,
    git_blob_for: Iterable[str] = (),
) -> dict[str, FileDigest]:
    """Hash files under ``root`` in parallel; largest first so the pool drains evenly."""
    rels = list(relpaths)
    git_set = set(git_blob_for)

    def size_of(rel: str) -> int:
        try:
            return os.stat(os.path.join(root, rel)).st_size
        except OSError:
            return 0

    rels.sort(key=size_of, reverse=True)
    out = map_files(
        lambda rel: hash_file(os.path.join(root, rel), git_blob=rel in git_set, on_bytes=on_bytes), rels, workers
    )
    return {rel: d for rel, d in out.items() if isinstance(d, FileDigest)}
