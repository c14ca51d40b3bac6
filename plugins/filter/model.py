# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the model lifecycle: the readiness gate, the model's defaults, the report table, progress lines,
the node's status file path and the engines' model drop-in. Thin wrappers over plugins/module_utils/shadowline."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any, Callable

from ansible.errors import AnsibleFilterError
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment import units
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.contract import effective_local_dir
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.model.readiness import readiness_gate
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.model.report import (
    progress_line,
    status_table,
    trim_result,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.model.spec import is_pinned, status_path_for


def _plain(value: Any) -> Any:
    """Ansible's tagged or lazy containers as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _status_of(value: Any) -> Any:
    """A node's status from what a play registered: a slurp of the status file (base64 ``content``; a failed
    slurp means no status file), a model_stage result, or a status dict. None stays None."""
    value = _plain(value)
    if not isinstance(value, dict):
        return None
    if "content" in value and "encoding" in value:
        try:
            return json.loads(base64.b64decode(value["content"]).decode("utf-8"))
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
    if value.get("skipped") or (value.get("failed") and "status" not in value and "state" not in value):
        return None  # e.g. a slurp that found no status file
    return value


def model_readiness(statuses: Any, expected_revision: str | None = None,
                    expected_model_id: str | None = None) -> list[str]:
    """The readiness gate: problems (each naming the host) that must be fixed before engines start; [] means go.

    ``statuses``: a dict host -> (slurped status file | model_stage result | status dict | None), or a list of
    results each carrying ``host`` (as the model_cache role's ``model_cache_result`` facts do).
    ``expected_revision`` is compared only when it is a pinned commit.
    """
    statuses = _plain(statuses)
    if isinstance(statuses, list):
        statuses = {str(item.get("host")): item for item in statuses if isinstance(item, dict)}
    if not isinstance(statuses, dict):
        raise AnsibleFilterError("shadowline.gms.model_readiness: expects a dict of host -> status, "
                                 f"or a list of results with 'host'; got {type(statuses).__name__}")
    if expected_revision and not is_pinned(str(expected_revision)):
        expected_revision = None  # a branch (gms_model_allow_unpinned): nodes hold its commit, compared with each other
    return readiness_gate({host: _status_of(value) for host, value in statuses.items()},
                          expected_revision=expected_revision or None, expected_model_id=expected_model_id or None)


def model_status(value: Any) -> dict[str, Any]:
    """A node's parsed status (from a slurp of its status file, a model_stage result or a status dict); {} if none."""
    return _status_of(value) or {}


def model_effective(model: Any) -> Any:
    """``gms_model`` with the contract's defaults applied (``local_dir``: /var/lib/shadowline/models/<id>/<rev>)."""
    model = _plain(model)
    if not isinstance(model, dict):
        return model  # model_stage names the field and the fix
    local_dir = effective_local_dir(model)
    return dict(model, local_dir=local_dir) if local_dir else model


def model_status_path(local_dir: str) -> str:
    """The node's status file beside ``local_dir``: <parent>/.shadowline-model-<name>.status.json."""
    return status_path_for(str(local_dir))


def model_result(result: Any, host: str | None = None) -> dict[str, Any]:
    """A model_stage (or async_status) result trimmed to what a fact should keep, with ``host``."""
    return trim_result(_plain(result) or {}, host)


def model_table(results: Any) -> str:
    """Every node's model (the model_cache role's results): status, revision, digest, size, last run."""
    results = _plain(results)
    if isinstance(results, dict):
        results = [dict(v, host=v.get("host", k)) for k, v in results.items() if isinstance(v, dict)]
    return status_table([r for r in results or [] if isinstance(r, dict)])


def model_progress(poll: Any) -> str:
    """The progress line of a running staging from the model_cache role's poll result."""
    poll = _plain(poll)
    if not isinstance(poll, dict) or "stdout" not in poll:
        return "waiting"
    return progress_line(poll["stdout"])


def model_dropin(digest: str) -> str:
    """The engines' model.conf drop-in recording the model digest (SHADOWLINE_MODEL_DIGEST)."""
    if not digest:
        raise AnsibleFilterError("shadowline.gms.model_dropin: no digest (the readiness gate did not pass)")
    return units.engine_model_dropin(str(digest))


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "model_readiness": model_readiness,
            "model_status": model_status,
            "model_effective": model_effective,
            "model_status_path": model_status_path,
            "model_result": model_result,
            "model_table": model_table,
            "model_progress": model_progress,
            "model_dropin": model_dropin,
        }
