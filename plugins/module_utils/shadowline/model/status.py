"""Per-node model status file: ``<parent of local_dir>/.shadowline-model-<name>.status.json``.

It sits beside local_dir (not inside), so it survives the directory being replaced, and is
written atomically, so a controller task polling it (``slurp``) never reads half a file.

States:
  Pending      staging decided, nothing fetched yet in this run
  Downloading  fetching or verifying; ``progress`` holds bytes done, rate, time left
  Ready        local_dir holds the model at ``revision`` with manifest ``digest``, verified
  Failed       the last run failed; ``error`` says why (local_dir, if present, is the previous Ready copy
               only if ``digest`` is set)
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .fsutil import atomic_write_json, read_json

PENDING = "Pending"
DOWNLOADING = "Downloading"
READY = "Ready"
FAILED = "Failed"
STATES = (PENDING, DOWNLOADING, READY, FAILED)
SCHEMA = 1


@dataclass
class ModelStatus:
    state: str
    model_id: str
    revision: str | None
    local_dir: str
    digest: str | None = None
    error: str | None = None
    total_bytes: int | None = None
    files: int | None = None
    progress: dict[str, Any] | None = None
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    updated: str = ""
    updated_unix: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "state": self.state,
            "model_id": self.model_id,
            "revision": self.revision,
            "digest": self.digest,
            "error": self.error,
            "total_bytes": self.total_bytes,
            "files": self.files,
            "progress": self.progress,
            "local_dir": self.local_dir,
            "host": self.host,
            "pid": self.pid,
            "updated": self.updated,
            "updated_unix": self.updated_unix,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelStatus:
        return cls(
            state=str(data.get("state", "")),
            model_id=str(data.get("model_id", "")),
            revision=data.get("revision"),
            local_dir=str(data.get("local_dir", "")),
            digest=data.get("digest"),
            error=data.get("error"),
            total_bytes=data.get("total_bytes"),
            files=data.get("files"),
            progress=data.get("progress"),
            host=str(data.get("host", "")),
            pid=int(data.get("pid", 0) or 0),
            updated=str(data.get("updated", "")),
            updated_unix=float(data.get("updated_unix", 0) or 0),
        )


def write_status(path: str, status: ModelStatus, *, durable: bool = False) -> None:
    if status.state not in STATES:
        raise ValueError(f"unknown model state {status.state!r}")
    now = time.time()
    status.updated_unix = round(now, 3)
    status.updated = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    atomic_write_json(path, status.as_dict(), durable=durable)


def read_status(path: str) -> ModelStatus | None:
    try:
        return ModelStatus.from_dict(read_json(path))
    except (OSError, ValueError, TypeError):
        return None
