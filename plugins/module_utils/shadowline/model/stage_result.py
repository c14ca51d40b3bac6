"""What a staging run reports (``ensure_model`` / ``remove_model`` in stage.py): ``StageResult``, the module's
result, and the short views of a model's files it shows as the diff's before and after."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .manifest import Manifest


@dataclass
class StageResult:
    changed: bool
    state: str
    model_id: str
    revision: str | None
    digest: str | None
    total_bytes: int
    weight_bytes: int
    files: int
    local_dir: str
    manifest_path: str
    status_path: str
    actions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    fetched_bytes: int = 0
    fetch_seconds: float = 0.0
    verify_seconds: float = 0.0
    hashed_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "status": self.state,
            "model_id": self.model_id,
            "revision": self.revision,
            "digest": self.digest,
            "total_bytes": self.total_bytes,
            "weight_bytes": self.weight_bytes,
            "files": self.files,
            "local_dir": self.local_dir,
            "manifest_path": self.manifest_path,
            "status_path": self.status_path,
            "actions": list(self.actions),
            "notes": list(self.notes),
            "repaired": list(self.repaired),
            "fetched_bytes": self.fetched_bytes,
            "fetch_seconds": round(self.fetch_seconds, 6),
            "verify_seconds": round(self.verify_seconds, 6),
            "hashed_bytes": self.hashed_bytes,
        }


def file_lines(entries: list[tuple[str, int, str | None]], limit: int = 20) -> list[str]:
    lines = [f"{path}  {size if size is not None else '?'}  {sha[:12] if sha else '-'}" for path, size, sha in entries]
    return lines[:limit] + ([f"... {len(lines) - limit} more files"] if len(lines) > limit else [])


def manifest_view(manifest: Manifest) -> dict[str, Any]:
    view = manifest.summary()
    view["file_list"] = file_lines([(e.path, e.size, e.sha256) for e in sorted(manifest.files, key=lambda e: e.path)])
    return view
