"""Cheap structural check of a ``*.safetensors`` file: header parses and covers the file exactly.

Reads only the header (a few KiB to MiB), so it runs on every staged file; it catches truncation,
a pickle renamed to ``.safetensors`` and most torn writes without hashing anything.
Also checks that a ``*.safetensors.index.json`` names only shards that are present.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Collection

MAX_HEADER = 100 << 20


def check_safetensors(path: str) -> str | None:  # noqa: PLR0911 (over the size limits of pyproject.toml; split it when it changes next)
    """None if the file is a well-formed safetensors file, else the reason it is not."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                return f"too short for a safetensors header ({size} bytes)"
            (hlen,) = struct.unpack("<Q", head)
            if hlen == 0 or hlen > MAX_HEADER or 8 + hlen > size:
                return f"header length {hlen} does not fit the file ({size} bytes); not safetensors or truncated"
            raw = handle.read(hlen)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "header is not JSON; not a safetensors file"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or "data_offsets" not in info:
            return f"tensor {name!r} has no data_offsets"
        offsets = info["data_offsets"]
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(x, int) for x in offsets)):
            return f"tensor {name!r} has malformed data_offsets"
        if offsets[0] > offsets[1]:
            return f"tensor {name!r} has negative length"
        end = max(end, offsets[1])
    expected = 8 + hlen + end
    if expected != size:
        return f"tensors end at byte {expected} but the file has {size} bytes (truncated or padded)"
    return None


def check_index(path: str, present: Collection[str], index_rel: str) -> str | None:
    """None if every shard named by a ``*.safetensors.index.json`` weight_map is in ``present``."""
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"unreadable index: {exc}"
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        return None
    base = os.path.dirname(index_rel)
    missing = sorted(
        {
            str(shard)
            for shard in weight_map.values()
            if (os.path.join(base, str(shard)) if base else str(shard)) not in present
        }
    )
    if missing:
        shown = ", ".join(missing[:5])
        return f"names shards that are not staged: {shown}{' ...' if len(missing) > 5 else ''}"
    return None
