"""What a source offers: its file list (with sizes and, where the source knows them, hashes).

A ``shadowline-manifest.json`` found at a ``file://`` or ``rsync://`` source (a directory that
shadowline staged before, e.g. on a shared filesystem or a head node) supplies expected sha256
for every file and the revision, so a node staging from it verifies against the original.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import SourceError
from .manifest import Manifest
from .spec import ModelSpec, is_pinned


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int | None
    sha256: str | None = None
    git_oid: str | None = None  # git blob sha1 (Hub files not stored in LFS)


@dataclass
class Plan:
    revision: str
    files: list[RemoteFile]
    notes: list[str] = field(default_factory=list)
    source_manifest: bool = False

    def by_path(self) -> dict[str, RemoteFile]:
        return {f.path: f for f in self.files}


def apply_source_manifest(spec: ModelSpec, plan: Plan, manifest: Manifest, where: str) -> Plan:
    """Take expected hashes and the revision from a source's manifest; refuse a mismatching one."""
    if manifest.model_id != spec.model_id:
        raise SourceError(
            f"{where} holds model {manifest.model_id}, but gms_model.id is {spec.model_id}.",
            field="gms_model.source",
            fix="point gms_model.source at a copy of the pinned model.",
        )
    if is_pinned(spec.revision) and manifest.revision != spec.revision:
        raise SourceError(
            f"{where} holds revision {manifest.revision}, but gms_model.revision is {spec.revision}.",
            field="gms_model.revision",
            fix="restage the source at the pinned revision, or pin the revision the source holds.",
        )
    expected = manifest.by_path()
    files = []
    for rf in plan.files:
        entry = expected.get(rf.path)
        if entry is None:
            files.append(rf)
            continue
        if rf.size is not None and rf.size != entry.size:
            raise SourceError(
                f"{where}: {rf.path} is {rf.size} bytes but its manifest says {entry.size}; the source copy is damaged.",
                field="gms_model.source",
                fix="re-verify or restage the source directory.",
            )
        files.append(RemoteFile(rf.path, entry.size, entry.sha256, rf.git_oid))
    plan.files = files
    plan.revision = manifest.revision if not is_pinned(spec.revision) else spec.revision
    plan.source_manifest = True
    plan.notes.append(f"verifying against the source's manifest (digest {manifest.digest[:19]}…)")
    return plan


def no_manifest_note(where: str) -> str:
    return (
        f"{where} has no shadowline-manifest.json: the revision label is taken on trust; "
        "nodes are compared by digest at the readiness gate"
    )
