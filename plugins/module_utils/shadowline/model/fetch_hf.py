"""``hf://<repo>``: download with huggingface_hub at the pinned commit, into the staging directory.

Listing uses ``model_info(files_metadata=True)`` (sizes, LFS sha256, git blob ids, the resolved
commit) before anything is downloaded; each file is then fetched with ``hf_hub_download``
(``local_dir`` = staging directory, which keeps huggingface_hub's own resume metadata under
``.cache/huggingface``) and hashed; LFS files are checked against their sha256, small files
against their git blob id. ``HF_ENDPOINT`` (or ``hf_endpoint``) points at a mirror.
"""

from __future__ import annotations

import importlib
import inspect
import os
import socket
import sys
import typing
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .errors import MissingDependencyError, SourceError, SpecError
from .hashing import FileDigest, hash_file
from .plan import Plan, RemoteFile
from .progress import ProgressTracker
from .spec import ModelSpec, is_pinned

NAME = "hf"
REUSES_PARTIAL = True  # huggingface_hub skips files it already completed in local_dir
DEFAULT_WORKERS = 8
MIN_VERSION = "0.23"

DoneCallback = typing.Callable[[RemoteFile, FileDigest], None]


def _hub() -> Any:
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        return importlib.import_module("huggingface_hub")
    except ImportError as exc:
        raise MissingDependencyError(
            f"huggingface_hub is not installed for {sys.executable} on {socket.gethostname()}, "
            "and gms_model.source is hf://.",
            field="gms_model.source",
            fix=f"install it on the nodes: {sys.executable} -m pip install 'huggingface_hub>={MIN_VERSION}' "
            "(the model_cache role does this itself: it runs the module with the runtime's interpreter or a "
            "staging virtualenv that has it), or stage from file:// or rsync:// instead.",
        ) from exc


def _errors() -> Any:
    try:
        return importlib.import_module("huggingface_hub.errors")
    except ImportError:  # older releases
        return importlib.import_module("huggingface_hub.utils")


def _translate(exc: Exception, spec: ModelSpec, endpoint: str) -> Exception:
    errors = _errors()
    name = type(exc).__name__
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, getattr(errors, "RevisionNotFoundError", ())):
        return SpecError(
            f"gms_model.revision {spec.revision} does not exist in {spec.source.repo} at {endpoint}.",
            field="gms_model.revision",
            fix="copy the full commit id from the model's history.",
        )
    if isinstance(exc, getattr(errors, "GatedRepoError", ())) or status in (401, 403):
        return SourceError(
            f"{spec.source.repo} at {endpoint} refused access (HTTP {status or 'gated'}).",
            field="gms_model_hf_token_file",
            fix="accept the model's licence on the Hub with the token's account and set gms_model_hf_token_file.",
        )
    if isinstance(exc, getattr(errors, "RepositoryNotFoundError", ())):
        return SourceError(
            f"{spec.source.repo} not found at {endpoint} (or private and no valid token).",
            field="gms_model.id",
            fix="check gms_model.id / gms_model.source, and gms_model_hf_token_file for private repos.",
        )
    if status is None and ("Connect" in name or "Timeout" in name or "Offline" in name or isinstance(exc, OSError)):
        return SourceError(
            f"cannot reach {endpoint} from {socket.gethostname()}: {name}: {exc}.",
            field="gms_model.source",
            fix="set HF_ENDPOINT/hf_endpoint to a reachable mirror or proxy, or (air-gapped) stage from file:// or rsync://.",
        )
    return SourceError(
        f"listing/downloading {spec.source.repo} from {endpoint} failed: {name}: {exc}.",
        field="gms_model.source",
        fix="re-run; downloaded files are kept.",
    )


def _endpoint(spec: ModelSpec) -> str:
    if spec.hf_endpoint:
        return spec.hf_endpoint
    return getattr(importlib.import_module("huggingface_hub.constants"), "ENDPOINT", "https://huggingface.co")


def plan(spec: ModelSpec, token: str | None = None) -> Plan:
    hub = _hub()
    endpoint = _endpoint(spec)
    api = hub.HfApi(endpoint=spec.hf_endpoint, token=token)
    try:
        info = api.model_info(spec.source.repo, revision=spec.revision, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - translated into an actionable error
        raise _translate(exc, spec, endpoint) from exc
    sha = getattr(info, "sha", None)
    if not sha:
        raise SourceError(
            f"{endpoint} returned no commit id for {spec.source.repo}@{spec.revision}.",
            field="gms_model.source",
            fix="check that HF_ENDPOINT points at a Hub-compatible server.",
        )
    if is_pinned(spec.revision) and sha != spec.revision:
        raise SourceError(
            f"{endpoint} resolved {spec.revision} to {sha}.",
            field="gms_model.revision",
            fix="check that HF_ENDPOINT points at a Hub-compatible server.",
        )
    files = []
    for sib in info.siblings or []:
        lfs = getattr(sib, "lfs", None)
        if lfs is not None:
            files.append(RemoteFile(sib.rfilename, int(lfs.size), str(lfs.sha256), None))
        else:
            size = getattr(sib, "size", None)
            files.append(
                RemoteFile(sib.rfilename, int(size) if size is not None else None, None, getattr(sib, "blob_id", None))
            )
    result = Plan(revision=sha, files=files)
    if sha != spec.revision:
        result.notes.append(f"unpinned revision {spec.revision!r} resolved to commit {sha}")
    return result


def _tqdm_class(tracker: ProgressTracker) -> type:
    """A stand-in for tqdm that forwards downloaded bytes to the tracker and draws nothing."""

    class _Bar:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.total = kwargs.get("total")
            self.n = int(kwargs.get("initial") or 0)
            self.disable = False
            if self.n:
                tracker.add_bytes(self.n)

        def update(self, n: float | None = 1) -> None:
            if n:
                self.n += int(n)
                tracker.add_bytes(int(n))

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: Any) -> bool:
            return False

        def close(self) -> None:
            return None

        def __getattr__(self, name: str) -> Callable[..., None]:
            return lambda *args, **kwargs: None

    return _Bar


def fetch(
    spec: ModelSpec,
    token: str | None,
    source_plan: Plan,
    files: list[RemoteFile],
    staging_dir: str,
    tracker: ProgressTracker,
    done: DoneCallback,
) -> None:
    hub = _hub()
    endpoint = _endpoint(spec)
    download = hub.hf_hub_download
    params = inspect.signature(download).parameters
    extra: dict[str, Any] = {}
    if "tqdm_class" in params:
        extra["tqdm_class"] = _tqdm_class(tracker)
    if spec.hf_endpoint:
        extra["endpoint"] = spec.hf_endpoint

    def one(rf: RemoteFile) -> None:
        try:
            path = download(
                repo_id=spec.source.repo,
                filename=rf.path,
                revision=source_plan.revision,
                local_dir=staging_dir,
                token=token,
                **extra,
            )
        except Exception as exc:  # noqa: BLE001 - translated into an actionable error
            raise _translate(exc, spec, endpoint) from exc
        if "tqdm_class" not in extra:
            tracker.add_bytes(rf.size or 0)
        digest = hash_file(path, git_blob=rf.git_oid is not None)
        done(rf, digest)

    order = sorted(files, key=lambda f: f.size or 0, reverse=True)
    workers = min(spec.workers or DEFAULT_WORKERS, max(1, len(order)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shadowline-hf") as pool:
        futures = [pool.submit(one, rf) for rf in order]
        error: BaseException | None = None
        for fut in futures:
            try:
                fut.result()
            except BaseException as exc:  # noqa: BLE001 - first error re-raised after all finish
                error = error or exc
    if error is not None:
        raise error
