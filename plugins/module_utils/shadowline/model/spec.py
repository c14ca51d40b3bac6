"""The model spec: what to stage, from where, into which node-local directory.

Built from the inventory contract (``gms_model`` plus the ``gms_model_*`` flags) by
``spec_from_inventory``; every error names the inventory field.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from ..common.values import as_bool
from .errors import SpecError

FORMATS = ("safetensors", "pytorch")
DEFAULT_FORMAT = "safetensors"
VERIFY_MODES = ("fast", "full")
SCHEMES = ("hf", "file", "rsync", "rsync+ssh")

# gms_model.id: a repository id (owner/name, or name); the contract checks the inventory with it too
MODEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_HOST_RE = re.compile(r"^[A-Za-z0-9._:\[\]-]+$")
# an rsync/ssh host or user must not start with "-" (it would reach rsync or ssh as an option)
_SAFE_HOST_RE = re.compile(r"^[A-Za-z0-9:\[][A-Za-z0-9._:\[\]-]*$")
_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_LABEL_RE = re.compile(r"[^A-Za-z0-9._-]")
PINNED_RE = re.compile(r"^[0-9a-f]{40}$")

MODEL_KEYS = ("id", "revision", "source", "local_dir", "format")


def is_pinned(revision: str) -> bool:
    """True for a full 40-hex lowercase commit id."""
    return bool(PINNED_RE.match(revision or ""))


@dataclass(frozen=True)
class Source:
    """A parsed ``gms_model.source`` URI."""

    scheme: str
    uri: str
    repo: str | None = None
    path: str | None = None
    host: str | None = None
    port: int | None = None
    user: str | None = None

    @property
    def rsync_url(self) -> str:
        """The source directory as rsync understands it (trailing slash: copy contents)."""
        path = (self.path or "").rstrip("/") + "/"
        userpart = f"{self.user}@" if self.user else ""
        if self.scheme == "rsync":
            port = f":{self.port}" if self.port else ""
            return f"rsync://{userpart}{self.host}{port}/{path.lstrip('/')}"
        return f"{userpart}{self.host}:{path}"


def parse_source(uri: str | None, model_id: str) -> Source:
    """Parse a source URI; an empty one means ``hf://<model_id>``."""
    field = "gms_model.source"
    if not uri:
        return Source(scheme="hf", uri=f"hf://{model_id}", repo=model_id)
    uri = str(uri)
    _check_source_text(field, uri)
    if "://" not in uri:
        raise SpecError(
            f"{field} {uri!r} is not a URI.",
            field=field,
            fix="use hf://<repo>, file:///<absolute path>, rsync://<host>[:port]/<module>/<path> "
            "or rsync+ssh://[user@]<host>/<absolute path>.",
        )
    scheme = uri.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise SpecError(
            f"{field} {uri!r} has unsupported scheme {scheme!r}.",
            field=field,
            fix=f"use one of {', '.join(s + '://' for s in SCHEMES)}.",
        )
    if scheme == "hf":
        repo = uri.split("://", 1)[1].strip("/")
        if not MODEL_ID_RE.match(repo):
            raise SpecError(
                f"{field} {uri!r}: {repo!r} is not a Hugging Face repo id.",
                field=field,
                fix="write hf://<owner>/<name>, e.g. hf://meta-llama/Llama-3.3-70B-Instruct.",
            )
        return Source(scheme="hf", uri=f"hf://{repo}", repo=repo)
    parts = urlsplit(uri)
    if parts.password:
        raise SpecError(
            f"{field} must not carry a password.",
            field=field,
            fix="remove the password from the URI; use ssh keys or the rsync daemon's own auth.",
        )
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise SpecError(
                f"{field} {uri!r} names host {parts.netloc!r}; file:// is for a path every node sees.",
                field=field,
                fix="write file:///<absolute path> (three slashes), or use rsync:// to pull from a host.",
            )
        _check_source_text(field, unquote(parts.path), uri)
        path = os.path.normpath(unquote(parts.path))
        if not os.path.isabs(path):
            raise SpecError(
                f"{field} {uri!r}: path must be absolute.", field=field, fix="write file:///<absolute path>."
            )
        return Source(scheme="file", uri=f"file://{path}", path=path)
    host = _remote_host(field, uri, scheme, parts.hostname, parts.username)
    try:
        port = parts.port
    except ValueError as exc:
        raise SpecError(f"{field} {uri!r}: bad port ({exc}).", field=field, fix="use host:port with a number.") from exc
    path = unquote(parts.path)
    _check_source_text(field, path, uri)  # %20 or %0A decode to the whitespace the text check refused
    if not path.strip("/"):
        raise SpecError(f"{field} {uri!r} has no path.", field=field, fix=f"write {scheme}://<host>/<path>.")
    if ".." in path.split("/"):
        raise SpecError(f"{field} {uri!r} must not contain '..'.", field=field, fix="use a normalised path.")
    return Source(scheme=scheme, uri=uri, host=host, port=port, user=parts.username, path=path)


def _check_source_text(field: str, text: str, uri: str | None = None) -> None:
    """A source (or the path it decodes to, with ``uri``) is one word: no whitespace or control character anywhere
    (the source travels to the hub, rsync and ssh as one argument, and a trimmed or split value is another source),
    and it never reads as an option (a leading '-')."""
    shown = uri if uri is not None else text
    where = " in its path" if uri is not None else ""
    if any(c.isspace() or not c.isprintable() for c in text):
        raise SpecError(f"{field} {shown!r} has whitespace or a control character{where}.", field=field,
                        fix="write the source as one word, without spaces, tabs or newlines anywhere (rename a "
                        "source directory whose name has one).")
    if text.startswith("-"):
        raise SpecError(f"{field} {shown!r} starts with '-', so a command would read it as an option.", field=field,
                        fix="write a URI: hf://<repo>, file:///<absolute path>, rsync://<host>/<path> or "
                        "rsync+ssh://[user@]<host>/<absolute path>.")


def _remote_host(field: str, uri: str, scheme: str, host: str | None, user: str | None) -> str:
    """The host of an rsync source; host and user must not read as options to rsync or ssh."""
    if not host or not _HOST_RE.match(host):
        raise SpecError(f"{field} {uri!r} has no host.", field=field, fix=f"write {scheme}://<host>/<path>.")
    if not _SAFE_HOST_RE.match(host):
        raise SpecError(f"{field} {uri!r}: host {host!r} does not start with a letter, digit or '['.", field=field,
                        fix="write the host name or address of the source (a leading '-' would be read as an option).")
    if user is not None and not _USER_RE.match(user):
        raise SpecError(f"{field} {uri!r}: user {user!r} is not a plain user name.", field=field,
                        fix="use letters, digits, '.', '_' and '-' (not first) in the user name, "
                        "or leave it out and set the user in ~/.ssh/config.")
    return host


@dataclass(frozen=True)
class ModelSpec:
    """Everything ``ensure_model`` needs; build it with ``spec_from_inventory``."""

    model_id: str
    revision: str
    source: Source
    local_dir: str
    format: str = "safetensors"
    allow_pickle: bool = False
    allow_unpinned: bool = False
    verify: str = "fast"
    hf_token_file: str | None = None
    allow_patterns: tuple[str, ...] | None = None
    hf_endpoint: str | None = None
    workers: int = 0

    @property
    def name(self) -> str:
        return os.path.basename(self.local_dir)

    @property
    def parent(self) -> str:
        return os.path.dirname(self.local_dir)

    def staging_dir(self, revision: str) -> str:
        """Sibling of local_dir (same filesystem, so the final rename is atomic)."""
        label = _LABEL_RE.sub("_", revision)[:64] or "unknown"
        return os.path.join(self.parent, f".{self.name}.staging-{label}")

    @property
    def staging_prefix(self) -> str:
        return f".{self.name}.staging-"

    @property
    def aside_dir(self) -> str:
        return os.path.join(self.parent, f".{self.name}.previous")

    @property
    def status_path(self) -> str:
        return status_path_for(self.local_dir)

    @property
    def lock_path(self) -> str:
        return os.path.join(self.parent, f".shadowline-model-{self.name}.lock")


def status_path_for(local_dir: str) -> str:
    """``<parent>/.shadowline-model-<name>.status.json`` beside local_dir (survives its replacement)."""
    local_dir = os.path.normpath(os.path.expanduser(local_dir))
    return os.path.join(os.path.dirname(local_dir), f".shadowline-model-{os.path.basename(local_dir)}.status.json")


def _as_bool(value: Any, field: str) -> bool:
    parsed = as_bool(value)
    if parsed is not None:
        return parsed
    raise SpecError(f"{field} must be a boolean, got {value!r}.", field=field, fix="set it to true or false.")


def spec_from_inventory(  # noqa: C901 (over the size limits of pyproject.toml; split it when it changes next)
    model: Mapping[str, Any],
    *,
    allow_pickle: Any = False,
    allow_unpinned: Any = False,
    verify: str | None = "fast",
    hf_token_file: str | None = None,
    allow_patterns: Sequence[str] | None = None,
    hf_endpoint: str | None = None,
    workers: int | None = 0,
) -> ModelSpec:
    """Validate ``gms_model`` and the flags; keys of ``gms_model`` this library does not use are ignored."""
    if not isinstance(model, Mapping):
        raise SpecError(
            f"gms_model must be a mapping, got {type(model).__name__}.",
            field="gms_model",
            fix="define gms_model with id, revision, local_dir (and optionally source, format).",
        )
    model_id = str(model.get("id") or "").strip()
    if not model_id:
        raise SpecError(
            "gms_model.id is missing.", field="gms_model.id", fix="set it, e.g. meta-llama/Llama-3.3-70B-Instruct."
        )
    if not MODEL_ID_RE.match(model_id):
        raise SpecError(
            f"gms_model.id {model_id!r} is not a repo id (owner/name, letters, digits, '.', '_', '-').",
            field="gms_model.id",
            fix="use the Hugging Face repo id of the model.",
        )
    revision = str(model.get("revision") or "").strip()
    if not revision:
        raise SpecError(
            "gms_model.revision is missing.",
            field="gms_model.revision",
            fix="pin the model's 40-hex commit id (the Hub's 'Files and versions' history).",
        )
    local_dir = str(model.get("local_dir") or "").strip()
    if not local_dir:
        raise SpecError(
            "gms_model.local_dir is missing.",
            field="gms_model.local_dir",
            fix="set a node-local directory, e.g. /var/lib/shadowline/models/llama-3.3-70b.",
        )
    local_dir = os.path.normpath(os.path.expanduser(local_dir))
    if not os.path.isabs(local_dir) or local_dir == "/" or os.path.basename(local_dir).startswith("."):
        raise SpecError(
            f"gms_model.local_dir {local_dir!r} must be an absolute path below / whose last part does not start with '.'.",
            field="gms_model.local_dir",
            fix="use e.g. /var/lib/shadowline/models/<name>.",
        )
    fmt = str(model.get("format") or DEFAULT_FORMAT).strip().lower()
    if fmt not in FORMATS:
        raise SpecError(
            f"gms_model.format {fmt!r} is not supported.",
            field="gms_model.format",
            fix=f"use one of {', '.join(FORMATS)} (safetensors unless you must load pickle weights).",
        )
    verify = (verify or "fast").strip().lower()
    if verify not in VERIFY_MODES:
        raise SpecError(
            f"gms_model_verify {verify!r} is not supported.", field="gms_model_verify", fix="use fast or full."
        )
    source = parse_source(model.get("source"), model_id)
    if source.scheme == "file" and source.path is not None:
        if os.path.normpath(source.path) == local_dir:
            raise SpecError(
                "gms_model.source points at gms_model.local_dir itself.",
                field="gms_model.source",
                fix="stage from a different (shared) directory.",
            )
    patterns: tuple[str, ...] | None = None
    if allow_patterns is not None:
        if isinstance(allow_patterns, str):
            allow_patterns = [allow_patterns]
        patterns = tuple(str(p).strip() for p in allow_patterns if str(p).strip())
        if not patterns:
            raise SpecError(
                "allow_patterns is empty.",
                field="allow_patterns",
                fix="omit it for the default, or list glob patterns.",
            )
    try:
        n_workers = int(workers or 0)
    except (TypeError, ValueError) as exc:
        raise SpecError(
            f"workers must be an integer, got {workers!r}.", field="workers", fix="use 0 for auto."
        ) from exc
    if n_workers < 0 or n_workers > 64:
        raise SpecError(f"workers {n_workers} out of range.", field="workers", fix="use 0 (auto) to 64.")
    token_file = os.path.expanduser(str(hf_token_file)) if hf_token_file else None
    endpoint = str(hf_endpoint).rstrip("/") if hf_endpoint else None
    return ModelSpec(
        model_id=model_id,
        revision=revision,
        source=source,
        local_dir=local_dir,
        format=fmt,
        allow_pickle=_as_bool(allow_pickle, "gms_model_allow_pickle"),
        allow_unpinned=_as_bool(allow_unpinned, "gms_model_allow_unpinned"),
        verify=verify,
        hf_token_file=token_file,
        allow_patterns=patterns,
        hf_endpoint=endpoint,
        workers=n_workers,
    )
