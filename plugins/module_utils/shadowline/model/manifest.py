"""``shadowline-manifest.json``: the record of exactly what is staged in a local_dir.

The digest identifies the content only (paths, sizes, sha256), so the same model staged on two
nodes, from any source, has the same digest. Stat keys (size, mtime_ns, ctime_ns, inode) are
node-local and let a later run re-verify without hashing.

Canonical form hashed for the digest: one line per file, sorted by path (byte order of UTF-8)::

    <sha256 hex> <size in decimal> <relative posix path>\\n

and ``digest = "sha256:" + sha256(all lines)``.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import VerifyError
from .fsutil import atomic_write_json, read_json
from .policy import MANIFEST_NAME, is_weight

SCHEMA = 1


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str
    mtime_ns: int = 0
    ctime_ns: int = 0
    ino: int = 0

    def stat_key(self) -> tuple[int, int, int, int]:
        return (self.size, self.mtime_ns, self.ctime_ns, self.ino)

    def with_stat(self, st: os.stat_result) -> FileEntry:
        return FileEntry(self.path, self.size, self.sha256, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256,
            "mtime_ns": self.mtime_ns,
            "ctime_ns": self.ctime_ns,
            "ino": self.ino,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FileEntry:
        return cls(
            path=str(data["path"]),
            size=int(data["size"]),
            sha256=str(data["sha256"]),
            mtime_ns=int(data.get("mtime_ns", 0)),
            ctime_ns=int(data.get("ctime_ns", 0)),
            ino=int(data.get("ino", 0)),
        )


def stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def files_digest(entries: Iterable[FileEntry]) -> str:
    sha = hashlib.sha256()
    for entry in sorted(entries, key=lambda e: e.path.encode("utf-8")):
        sha.update(f"{entry.sha256} {entry.size} {entry.path}\n".encode())
    return "sha256:" + sha.hexdigest()


@dataclass
class Manifest:
    model_id: str
    revision: str
    source: str
    format: str
    files: list[FileEntry]
    patterns: list[str] = field(default_factory=list)
    requested_revision: str | None = None
    created: str = ""

    @property
    def digest(self) -> str:
        return files_digest(self.files)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files)

    @property
    def weight_bytes(self) -> int:
        return sum(e.size for e in self.files if is_weight(e.path))

    def by_path(self) -> dict[str, FileEntry]:
        return {e.path: e for e in self.files}

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model_id": self.model_id,
            "revision": self.revision,
            "requested_revision": self.requested_revision or self.revision,
            "source": self.source,
            "format": self.format,
            "patterns": list(self.patterns),
            "created": self.created,
            "total_bytes": self.total_bytes,
            "weight_bytes": self.weight_bytes,
            "file_count": len(self.files),
            "digest": self.digest,
            "files": [e.as_dict() for e in sorted(self.files, key=lambda e: e.path)],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"unknown manifest schema {data.get('schema')!r}")
        files = [FileEntry.from_dict(f) for f in data.get("files", [])]
        manifest = cls(
            model_id=str(data["model_id"]),
            revision=str(data["revision"]),
            source=str(data.get("source", "")),
            format=str(data.get("format", "safetensors")),
            files=files,
            patterns=[str(p) for p in data.get("patterns", [])],
            requested_revision=data.get("requested_revision"),
            created=str(data.get("created", "")),
        )
        if data.get("digest") != manifest.digest:
            raise ValueError("manifest digest does not match its file list (edited or torn)")
        return manifest

    def summary(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "revision": self.revision,
            "digest": self.digest,
            "files": len(self.files),
            "total_bytes": self.total_bytes,
            "weight_bytes": self.weight_bytes,
        }


def manifest_path(directory: str) -> str:
    return os.path.join(directory, MANIFEST_NAME)


def load_manifest(directory: str) -> Manifest | None:
    """The manifest in ``directory``; None if there is none. Raises ``VerifyError`` if it is unusable."""
    path = manifest_path(directory)
    if not os.path.exists(path):
        return None
    try:
        return Manifest.from_dict(read_json(path))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise VerifyError(
            f"{path} is unusable: {exc}.",
            field="gms_model.local_dir",
            fix="it will be restaged; do not edit the manifest by hand.",
        ) from exc


def save_manifest(directory: str, manifest: Manifest) -> str:
    if not manifest.created:
        manifest.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path = manifest_path(directory)
    atomic_write_json(path, manifest.as_dict())
    return path
