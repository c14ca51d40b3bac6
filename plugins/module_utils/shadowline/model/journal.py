"""The staging journal: ``<staging dir>/.shadowline-staging.jsonl``.

Line 1 names what is being staged (model, revision); each further line is one file that was
fetched completely and hashed (path, size, sha256, stat key), appended and fsync'ed as soon as the
file is done. A resumed staging keeps exactly the journaled files whose stat key is unchanged;
anything else in the staging directory is fetched again. A torn last line is ignored.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable

from .manifest import FileEntry, stat_key

JOURNAL_NAME = ".shadowline-staging.jsonl"


class Journal:
    def __init__(self, staging_dir: str, model_id: str, revision: str) -> None:
        self.staging_dir = staging_dir
        self.path = os.path.join(staging_dir, JOURNAL_NAME)
        self.model_id = model_id
        self.revision = revision
        self._lock = threading.Lock()

    def load(self) -> dict[str, FileEntry]:
        """Journaled files still intact on disk; a journal for another model/revision counts as empty."""
        try:
            with open(self.path, encoding="utf-8") as handle:
                lines = handle.read().splitlines()
        except OSError:
            return {}
        if not lines:
            return {}
        try:
            header = json.loads(lines[0])
        except ValueError:
            return {}
        if header.get("model_id") != self.model_id or header.get("revision") != self.revision:
            return {}
        entries: dict[str, FileEntry] = {}
        for line in lines[1:]:
            try:
                entry = FileEntry.from_dict(json.loads(line))
            except (ValueError, KeyError, TypeError):
                continue
            entries[entry.path] = entry
        intact = {}
        for rel, entry in entries.items():
            try:
                st = os.stat(os.path.join(self.staging_dir, rel))
            except OSError:
                continue
            if stat_key(st) == entry.stat_key():
                intact[rel] = entry
        return intact

    def start(self, keep: Iterable[FileEntry] = ()) -> None:
        """Rewrite the journal with its header and the entries being kept."""
        lines = [json.dumps({"model_id": self.model_id, "revision": self.revision})]
        lines += [json.dumps(e.as_dict(), sort_keys=True) for e in keep]
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)

    def append(self, entry: FileEntry) -> None:
        line = json.dumps(entry.as_dict(), sort_keys=True) + "\n"
        with self._lock:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
