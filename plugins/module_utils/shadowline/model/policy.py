"""What may be staged: pinned revisions, safe formats, which files, enough space.

Every check raises a ``PolicyError`` / ``SpaceError`` / ``SourceError`` naming the inventory
field and the fix; nothing here touches the network.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Iterable, Sequence

from .errors import PolicyError, SourceError, SpaceError
from .fsutil import free_bytes, human_bytes
from .spec import ModelSpec, is_pinned

# Weight files that are Python pickles (or zip archives of pickles): loading one runs arbitrary code.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".dill")

# What an inference engine needs besides the weights: configs, tokenizers, chat templates.
_SUPPORT_PATTERNS = (
    "*.json",
    "tokenizer.model",
    "*.tiktoken",
    "*.model",
    "merges.txt",
    "vocab.txt",
    "*.jinja",
)
DEFAULT_PATTERNS = {
    "safetensors": ("*.safetensors",) + _SUPPORT_PATTERNS,
    "pytorch": ("*.safetensors", "*.bin", "*.pt", "*.pth") + _SUPPORT_PATTERNS,
}

MANIFEST_NAME = "shadowline-manifest.json"


def is_pickle(path: str) -> bool:
    return path.lower().endswith(PICKLE_SUFFIXES)


def is_weight(path: str) -> bool:
    return path.lower().endswith(".safetensors") or is_pickle(path)


def check_spec(spec: ModelSpec) -> None:
    """Refusals that need only the spec."""
    if not is_pinned(spec.revision) and not spec.allow_unpinned:
        raise PolicyError(
            f"gms_model.revision {spec.revision!r} is not a pinned commit (40 lowercase hex digits); "
            "a branch or tag can move and nodes would load different weights.",
            field="gms_model.revision",
            fix="pin the full commit id (Hub: 'Files and versions' > history), or set gms_model_allow_unpinned: true.",
        )
    if spec.format != "safetensors" and not spec.allow_pickle:
        raise PolicyError(
            f"gms_model.format {spec.format!r} means pickle weights, which run code when loaded.",
            field="gms_model.format",
            fix="use format: safetensors (convert the checkpoint), or set gms_model_allow_pickle: true.",
        )
    if spec.allow_patterns and not spec.allow_pickle:
        bad = [p for p in spec.allow_patterns if is_pickle(p.rstrip("*"))]
        if bad:
            raise PolicyError(
                f"allow_patterns {bad} select pickle weights.",
                field="allow_patterns",
                fix="drop those patterns, or set gms_model_allow_pickle: true.",
            )


def patterns_for(spec: ModelSpec) -> tuple[str, ...]:
    return spec.allow_patterns or DEFAULT_PATTERNS[spec.format]


def safe_relpath(path: str) -> str:
    """A listing's path as a clean relative POSIX path; refuse anything that could escape the directory."""
    if not path or "\x00" in path or "\\" in path:
        raise SourceError(
            f"source lists an unusable file name {path!r}.", field="gms_model.source", fix="fix the source."
        )
    norm = posixpath.normpath(path)
    if norm.startswith("/") or norm == ".." or norm.startswith("../") or norm != path.rstrip("/"):
        raise SourceError(
            f"source lists {path!r}, which is not a plain relative path.",
            field="gms_model.source",
            fix="the source must not contain absolute paths or '..'.",
        )
    return norm


def _hidden(path: str) -> bool:
    return any(part.startswith(".") for part in path.split("/"))


def select_files(paths: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """Paths matching any pattern (fnmatch on the whole relative path, like huggingface_hub's allow_patterns).

    Hidden paths (any part starting with '.') and our own manifest are never selected.
    """
    out = []
    for path in paths:
        if _hidden(path) or path == MANIFEST_NAME:
            continue
        if any(
            fnmatch.fnmatchcase(path, pat) or fnmatch.fnmatchcase(posixpath.basename(path), pat) for pat in patterns
        ):
            out.append(path)
    return sorted(out)


def check_selection(spec: ModelSpec, all_paths: Sequence[str], selected: Sequence[str]) -> None:
    """Refusals that need the source's file list."""
    pickles = [p for p in selected if is_pickle(p)]
    if pickles and not spec.allow_pickle:
        raise PolicyError(
            f"refusing pickle weight files {_some(pickles)}: loading them runs arbitrary code.",
            field="gms_model_allow_pickle",
            fix="use the model's safetensors weights, or set gms_model_allow_pickle: true.",
        )
    weights = [p for p in selected if is_weight(p)]
    if weights:
        return
    source_pickles = [p for p in all_paths if is_pickle(p) and not _hidden(p)]
    if source_pickles and not spec.allow_pickle:
        raise PolicyError(
            f"{spec.source.uri} has no *.safetensors weights, only pickle weights {_some(source_pickles)}.",
            field="gms_model_allow_pickle",
            fix="stage a safetensors conversion of the model, or set gms_model_allow_pickle: true "
            "and gms_model.format: pytorch.",
        )
    raise SourceError(
        f"{spec.source.uri} at revision {spec.revision} has no weight files matching {list(patterns_for(spec))} "
        f"({len(all_paths)} files listed).",
        field="gms_model.source",
        fix="check gms_model.source / gms_model.revision, or widen allow_patterns.",
    )


def check_free_space(directory: str, needed: int, n_files: int) -> None:
    free = free_bytes(directory)
    if needed > free:
        raise SpaceError(
            f"not enough free space to stage {n_files} files into {directory}: need {needed} bytes "
            f"({human_bytes(needed)}), free {free} bytes ({human_bytes(free)}).",
            field="gms_model.local_dir",
            fix=f"free at least {human_bytes(needed - free)} on that filesystem, or point gms_model.local_dir at a larger one.",
        )


def _some(items: Sequence[str], n: int = 5) -> str:
    shown = ", ".join(items[:n])
    return f"[{shown}{', ...' if len(items) > n else ''}] ({len(items)} files)"
