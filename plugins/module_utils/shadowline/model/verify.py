"""Verify a staged directory against its manifest.

fast: one ``stat`` per file. A file whose (size, mtime_ns, ctime_ns, inode) equals the manifest's is
      taken as unchanged without reading it. A size change is corruption. Any other key change
      (touched, rewritten, chmod'ed, copied back) gets that one file rehashed: same sha256 means the
      entry's stat key is refreshed, different means corruption.
full: every file is rehashed (in parallel) and every ``*.safetensors`` header is checked.

Files in the directory that the manifest does not list are reported as ``extra`` (a stray pickle
next to the weights must not reach an engine).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .hashing import COUNTERS, hash_files
from .manifest import FileEntry, Manifest, stat_key
from .policy import MANIFEST_NAME
from .safetensors_header import check_safetensors


@dataclass
class VerifyReport:
    mode: str
    ok: dict[str, FileEntry] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)
    rehashed: list[str] = field(default_factory=list)
    hashed_bytes: int = 0
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.bad and not self.extra

    @property
    def refreshed(self) -> bool:
        """Some entries' stat keys changed but content matched: the manifest should be rewritten."""
        return bool(self.rehashed) and not self.bad

    def problems(self, limit: int = 10) -> list[str]:
        out = [f"{path}: {reason}" for path, reason in sorted(self.bad.items())]
        out += [f"{path}: not in manifest" for path in self.extra]
        return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


def list_files(root: str, skip_hidden_dirs: bool = False) -> list[str]:
    """Relative POSIX paths of regular files (and symlinks) under root."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        if skip_hidden_dirs:
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
            out.append(rel)
    return sorted(out)


def verify_dir(
    root: str,
    manifest: Manifest,
    mode: str = "fast",
    *,
    workers: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
    check_extra: bool = True,
) -> VerifyReport:
    start = time.monotonic()
    hashed_before = COUNTERS.snapshot()[1]
    report = VerifyReport(mode=mode)
    to_hash: dict[str, FileEntry] = {}
    stats: dict[str, os.stat_result] = {}
    for entry in manifest.files:
        path = os.path.join(root, entry.path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            report.bad[entry.path] = "missing"
            continue
        except OSError as exc:
            report.bad[entry.path] = f"unreadable: {exc.strerror or exc}"
            continue
        if st.st_size != entry.size:
            report.bad[entry.path] = f"size {st.st_size} != {entry.size}"
            continue
        stats[entry.path] = st
        if mode == "full" or stat_key(st) != entry.stat_key():
            to_hash[entry.path] = entry
        else:
            report.ok[entry.path] = entry
    if to_hash:
        digests = hash_files(root, list(to_hash), workers=workers, on_bytes=on_bytes)
        for rel, entry in to_hash.items():
            digest = digests[rel]
            if digest.sha256 != entry.sha256:
                report.bad[rel] = "sha256 mismatch"
                continue
            st = os.stat(os.path.join(root, rel))
            refreshed = entry.with_stat(st)
            if refreshed.stat_key() != entry.stat_key():
                report.rehashed.append(rel)
            report.ok[rel] = refreshed
    if mode == "full":
        for rel in list(report.ok):
            if rel.endswith(".safetensors"):
                reason = check_safetensors(os.path.join(root, rel))
                if reason:
                    report.bad[rel] = reason
                    del report.ok[rel]
    if check_extra:
        listed = set(manifest.by_path())
        report.extra = [p for p in list_files(root) if p not in listed and p != MANIFEST_NAME]
    hashed_after = COUNTERS.snapshot()[1]
    report.hashed_bytes = hashed_after - hashed_before
    report.seconds = time.monotonic() - start
    return report
