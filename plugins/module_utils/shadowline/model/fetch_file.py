"""``file:///<path>``: copy from a directory every node sees (NFS, Lustre, GPFS, a bind mount).

Each file is read once: copied and hashed in the same pass, written to a hidden ``.part`` name,
fsync'ed, then renamed to its final name and reported done. Files are copied in parallel.

The source is not trusted to stay inside itself (checked when listing, and again before each copy):
a symlink that leads out of the source directory, a FIFO, device or socket, and a file that is not
world-readable and not owned by the owner of the source directory (a root-only file dropped or
hard-linked into the tree) are refused, naming the file; no file is copied past its listed size.
"""

from __future__ import annotations

import os
import socket
import stat
import typing

from .errors import SourceError, VerifyError
from .hashing import FileDigest, copy_and_hash, default_workers, file_kind, map_files
from .manifest import load_manifest
from .plan import Plan, RemoteFile, apply_source_manifest, no_manifest_note
from .progress import ProgressTracker
from .spec import ModelSpec
from .verify import list_files

NAME = "file"
REUSES_PARTIAL = False  # non-journaled files in a staging dir are copied again

DoneCallback = typing.Callable[[RemoteFile, FileDigest], None]


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
    root_real, owner = os.path.realpath(root), os.stat(root).st_uid
    for rel in list_files(root, skip_hidden_dirs=True):
        size = checked_size(spec, root_real, owner, rel)
        if size is not None:
            files.append(RemoteFile(rel, size))
    result = Plan(revision=spec.revision, files=files)
    manifest = load_manifest(root)
    if manifest is not None:
        apply_source_manifest(spec, result, manifest, spec.source.uri)
    else:
        result.notes.append(no_manifest_note(spec.source.uri))
    return result


def _refuse(spec: ModelSpec, rel: str, what: str, fix: str) -> SourceError:
    return SourceError(f"gms_model.source {spec.source.uri}: {rel} {what}; nothing was staged.",
                       field="gms_model.source", fix=fix)


def checked_size(spec: ModelSpec, root_real: str, owner: int, rel: str) -> int | None:
    """The size of source file ``rel`` when it may be staged, None for a dangling symlink (skipped).

    Refused (SourceError naming the file): a symlink whose target leaves the source directory, anything but a
    regular file, and a file that is not world-readable and not owned by the source directory's owner (staging
    makes every file readable by the engines' service user, so it would publish such a file).
    """
    path = os.path.join(root_real, rel)
    try:
        link = os.lstat(path)
        st = os.stat(path)
    except OSError:
        return None  # dangling symlink (or gone since the listing)
    if stat.S_ISLNK(link.st_mode):
        target = os.path.realpath(path)
        if os.path.commonpath([root_real, target]) != root_real:
            raise _refuse(spec, rel, f"is a symlink to {target}, outside the source directory",
                          "replace the link with the file itself (cp -L), or point gms_model.source at the "
                          "directory that holds the files.")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(spec, rel, f"is {file_kind(st.st_mode)}, not a regular file",
                      "remove it from the source directory; only regular files are staged.")
    if not st.st_mode & stat.S_IROTH and st.st_uid != owner:
        raise _refuse(spec, rel, f"is readable only by uid {st.st_uid} (mode {stat.S_IMODE(st.st_mode):04o}), "
                      f"who does not own the source directory (uid {owner}); staged files are readable by every "
                      "local user",
                      "make it world-readable (chmod a+r) if it belongs to the model, or remove it from the source.")
    return st.st_size


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
    root_real, owner = os.path.realpath(root), os.stat(root).st_uid

    def copy_one(rel: str) -> None:
        rf = by_path[rel]
        src = os.path.join(root, rel)
        dst = os.path.join(staging_dir, rel)
        checked_size(spec, root_real, owner, rel)  # again: the source may have changed since it was listed
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = part_path(dst)
        try:
            digest = copy_and_hash(src, tmp, on_bytes=tracker.add_bytes, max_bytes=rf.size)
        except OSError as exc:
            if os.path.lexists(tmp):
                os.unlink(tmp)
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
