"""What a controller shows about the model on every node: one table, and one progress line per node.

Inputs are plain dicts as Ansible registers them: the ``model_stage`` module's result (or a node's
status file, see status.py), each with a ``host`` key. Nothing here touches the disk or the network.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .fsutil import human_bytes

# The keys of a model_stage result worth keeping in a fact (no invocation, no diff).
RESULT_KEYS = (
    "changed", "failed", "status", "model_id", "revision", "digest", "total_bytes", "weight_bytes", "files",
    "local_dir", "status_path", "actions", "notes", "repaired", "fetched_bytes", "fetch_seconds",
    "verify_seconds", "hashed_bytes", "msg", "field", "fix",
)


def trim_result(result: Mapping[str, Any], host: str | None = None) -> dict[str, Any]:
    """The part of a model_stage (or async_status) result a role keeps, with ``host``.

    An async job that never finished, or a result without a status, is reported as Failed with a message.
    """
    data = {key: result[key] for key in RESULT_KEYS if key in result}
    if host is not None:
        data["host"] = host
    if "status" in data:  # every model_stage result has one (Ready, Pending, Failed, Absent)
        if data["status"] == "Failed":
            data["failed"] = True
        return data
    # No module result: the background job is still running, or its process died (the async wrapper then
    # reports unparsable output), or the task failed before the module ran.
    data.update(status="Failed", failed=True)
    if result.get("finished") in (0, False):
        data["msg"] = "the staging did not finish within model_cache_timeout_s; it was stopped. Re-run to resume."
    elif "cmd" in result and ("data" in result or "outdata" in result):
        stderr = " | ".join(str(result.get("stderr") or "").strip().splitlines()[-2:])
        data["msg"] = ("the staging process died without a result (killed, or out of memory)"
                       + (f": {stderr}" if stderr else "") + ". Re-run to resume: files already fetched are kept.")
    else:
        data["msg"] = str(result.get("msg") or "model staging failed without a message")
    return data


def _short_digest(digest: str | None) -> str:
    return digest[:19] if digest else "-"


def _seconds(value: Any) -> str:
    seconds = float(value or 0)
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def last_run(result: Mapping[str, Any]) -> str:
    """One phrase for what the last run did on a node."""
    if result.get("failed") or result.get("status") == "Failed":
        field = f"{result['field']}: " if result.get("field") else ""
        text = f"FAILED {field}{result.get('msg') or result.get('error') or ''}".strip()
        return text if len(text) <= 100 else text[:99] + "…"
    if result.get("status") == "Pending":  # check mode: what would happen
        actions = [a for a in result.get("actions", []) if a.startswith(("fetch", "resume", "repair", "replace"))]
        return "would " + (actions[-1].split(" from ")[0] if actions else "stage")
    if result.get("changed"):
        fetched = int(result.get("fetched_bytes") or 0)
        seconds = float(result.get("fetch_seconds") or 0)
        rate = f", {human_bytes(fetched / seconds)}/s" if seconds > 0 and fetched else ""
        what = f"repaired {len(result.get('repaired') or [])} file(s)" if result.get("repaired") else "staged"
        return f"{what}: fetched {human_bytes(fetched)} in {_seconds(seconds)}{rate}"
    hashed = int(result.get("hashed_bytes") or 0)
    return f"verified in {_seconds(result.get('verify_seconds'))} ({human_bytes(hashed)} hashed)"


def status_table(results: Sequence[Mapping[str, Any]]) -> str:
    """Every node's model: status, revision, digest, files, size and what the last run did."""
    header = ["node", "status", "revision", "digest", "files", "size", "last run"]
    rows = []
    for result in sorted(results, key=lambda r: str(r.get("host", ""))):
        revision = result.get("revision") or "-"
        rows.append([
            str(result.get("host", "?")), str(result.get("status") or "?"), revision[:12],
            _short_digest(result.get("digest")), str(result.get("files") if result.get("files") is not None else "-"),
            human_bytes(result["total_bytes"]) if result.get("total_bytes") else "-", last_run(result),
        ])
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header) - 1)]
    lines = []
    for row in [header, ["-" * w for w in widths] + ["-" * 8]] + rows:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])) + "  " + row[-1])
    model = next((f"{r['model_id']}@{(r.get('revision') or '')[:12]}" for r in results if r.get("model_id")), "")
    digests = {r.get("digest") for r in results if r.get("status") == "Ready"}
    ready = sum(1 for r in results if r.get("status") == "Ready")
    if ready == len(results) and len(digests) == 1:
        lines.append(f"{model}: all {ready} node(s) Ready with digest {digests.pop()}")
    else:
        lines.append(f"{model}: {ready} of {len(results)} node(s) Ready, {len(digests)} distinct digest(s)")
    return "\n".join(line.rstrip() for line in lines)


def progress_line(stdout: str) -> str:
    """The line shown for a node while its staging runs.

    ``stdout``: first line ``running`` or ``finished`` (whether the background job wrote its result), then the
    node's status file (JSON), as the model_cache role's progress poll prints them.
    """
    first, _unused, rest = (stdout or "").partition("\n")
    try:
        status = json.loads(rest) if rest.strip() else {}
    except ValueError:
        status = {}
    state = status.get("state") or "starting"
    if first.strip() == "finished":
        return f"finished ({state})"
    if state in ("Ready", "Failed"):
        return f"{state}, finishing"
    progress = status.get("progress") or {}
    if progress.get("text"):
        return f"{state}: {progress['text']}"
    return state
