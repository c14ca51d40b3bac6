"""The readiness gate: engines start only when every node holds the same verified model.

``readiness_gate(statuses)`` takes each node's status (a ``ModelStatus``, or the dict read from its
status file / returned by the module) and returns a list of problems; an empty list means go.
Each problem names the host and what differs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from .status import READY, ModelStatus


def _as_status(value: ModelStatus | Mapping[str, Any] | None) -> ModelStatus | None:
    if value is None or isinstance(value, ModelStatus):
        return value
    if isinstance(value, Mapping):
        # Accept the module's return value too: it carries 'status' as the state.
        data = dict(value)
        if "state" not in data and isinstance(data.get("status"), str):
            data["state"] = data["status"]
            if not data.get("error") and data.get("msg"):
                data["error"] = data["msg"]
        return ModelStatus.from_dict(data)
    return None


def _short(digest: str | None) -> str:
    if not digest:
        return "none"
    return digest if len(digest) <= 19 else digest[:19] + "…"


def _hosts(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def readiness_gate(  # noqa: C901, PLR0912 (over the size limits of pyproject.toml; split it when it changes next)
    statuses: Mapping[str, ModelStatus | Mapping[str, Any] | None],
    *,
    expected_revision: str | None = None,
    expected_model_id: str | None = None,
) -> list[str]:
    """Problems that must be fixed before engines may start; empty means every node is Ready and identical."""
    problems: list[str] = []
    if not statuses:
        return ["no node reported a model status; stage the model first (shadowline.gms.model_stage)."]
    parsed = {host: _as_status(value) for host, value in statuses.items()}
    ready: dict[str, ModelStatus] = {}
    for host in sorted(parsed):
        status = parsed[host]
        if status is None:
            problems.append(f"{host}: no model status (status file missing or unreadable); stage the model on it.")
            continue
        if status.state != READY:
            detail = f": {status.error}" if status.error else ""
            if status.progress and isinstance(status.progress, Mapping) and status.progress.get("text"):
                detail = f" ({status.progress['text']})"
            problems.append(f"{host}: model is {status.state or 'unknown'}, not Ready{detail}.")
            continue
        if not status.digest:
            problems.append(f"{host}: Ready but reports no manifest digest; restage it.")
            continue
        if not status.revision:
            problems.append(f"{host}: Ready but reports no revision; restage it.")
            continue
        ready[host] = status
    if expected_model_id:
        for host, status in ready.items():
            if status.model_id and status.model_id != expected_model_id:
                problems.append(f"{host}: holds model {status.model_id}, expected {expected_model_id}.")
    if expected_revision:
        for host, status in ready.items():
            if status.revision != expected_revision:
                problems.append(
                    f"{host}: holds revision {status.revision}, the pinned revision is {expected_revision}."
                )
    for attr, label in (("revision", "revision"), ("digest", "manifest digest")):
        values = Counter(getattr(s, attr) for s in ready.values())
        if len(values) <= 1:
            continue
        majority = values.most_common(1)[0][0]
        holders = [h for h, s in ready.items() if getattr(s, attr) == majority]
        for host, status in sorted(ready.items()):
            value = getattr(status, attr)
            if value != majority:
                shown = _short(value) if attr == "digest" else value
                expected = _short(majority) if attr == "digest" else majority
                problems.append(
                    f"{host}: {label} {shown} differs from {expected} held by {_hosts(holders)}; restage {host}."
                )
    return problems
