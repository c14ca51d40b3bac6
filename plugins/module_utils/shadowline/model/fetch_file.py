"""``file:///<path>``: copy from a directory every node sees (NFS, Lustre, GPFS, a bind mount).

Each file is read once: copied and hashed in the same pass, written to a hidden ``.part`` name,
fsync'ed, then renamed to its final name and reported done. Files are copied in parallel.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

from .errors import SourceError, VerifyError
from .hashing import FileDigest, copy_and_hash, default_workers, map_files
from .manifest import load_manifest
from .plan import Plan, RemoteFile, apply_source_manifest, no_manifest_note
from .progress import ProgressTracker
from .spec import ModelSpec
from .verify import list_files

NAME = "file"
REUSES_PARTIAL = False  # non-journaled files in a staging dir are copied again

DoneCallback = Callable[[RemoteFile, FileDigest], None]


def part_path(dst: str) -> str:
    return os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.part")


def plan(spec: ModelSpec, token: str | None = None) -> Plan:
    root = spec.source.path or ""
    if not os.path.isdir(root):
        raise SourceError(
            f"gms_model.source {spec.source.uri}: {root} is not a directory on {socket.gethostname()}.",
            field="gms_model.source",
            fix="mount the shared filesystem on every node, or fix the path.",
        )
    files = []
    for rel in list_files(root, skip_hidden_dirs=True):
        try:
            size = os.stat(os.path.join(root, rel)).st_size
        except OSError:
            continue  # dangling symlink
        files.append(RemoteFile(rel, size))
    result = Plan(revision=spec.revision, files=files)
    manifest = load_manifest(root)
    if manifest is not None:
        apply_source_manifest(spec, result, manifest, spec.source.uri)
    else:
        result.notes.append(no_manifest_note(spec.source.uri))
    return result


def fetch(
    spec: ModelSpec,
    token: str | None,
    source_plan: Plan,
    files: list[RemoteFile],
    staging_dir: str,
    tracker: ProgressTracker,
    done: DoneCallback,
) -> None:
    root = spec.source.path or ""

    def copy_one(rel: str) -> None:
        rf = by_path[rel]
        src = os.path.join(root, rel)
        dst = os.path.join(staging_dir, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = part_path(dst)
        try:
            digest = copy_and_hash(src, tmp, on_bytes=tracker.add_bytes)
        except OSError as exc:
            raise SourceError(
                f"copying {src} failed: {exc.strerror or exc}.",
                field="gms_model.source",
                fix="check the shared filesystem on this node and re-run (copied files are kept).",
            ) from exc
        if rf.size is not None and digest.size != rf.size:
            os.unlink(tmp)
            raise VerifyError(
                f"{src} changed size while being copied ({rf.size} -> {digest.size}).",
                field="gms_model.source",
                fix="do not modify the source while nodes stage from it; re-run.",
            )
        os.replace(tmp, dst)
        done(rf, digest)

    by_path = {f.path: f for f in files}
    order = sorted(by_path, key=lambda p: by_path[p].size or 0, reverse=True)
    map_files(copy_one, order, spec.workers or default_workers())
