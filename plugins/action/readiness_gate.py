# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of shadowline.gms.readiness_gate: every node of the deployment holds the same verified model,
or the play stops with one message naming each node that differs and the fix."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import Plan
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.model.readiness import readiness_gate
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.model.spec import is_pinned


def slurped_status(result: Mapping[str, Any]) -> dict[str, Any] | None:
    """The status file's JSON from what slurp registered; None for a missing, unreadable or skipped file."""
    content = result.get("content")
    if result.get("skipped") or not isinstance(content, str):
        return None
    try:
        status = json.loads(base64.b64decode(content).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def node_statuses(plan: Plan, reads: list[Any]) -> dict[str, dict[str, Any] | None]:
    """Every node of the plan -> its status (None where nobody read it or it has none)."""
    statuses: dict[str, dict[str, Any] | None] = {host: None for host in plan.hosts}
    for read in reads:
        if not isinstance(read, Mapping):
            continue
        for result in read.get("results", [read]):
            node = result.get("item") if isinstance(result, Mapping) else None
            if node in statuses and statuses[node] is None:
                statuses[node] = slurped_status(result)
    return statuses


def gate_message(plan: Plan, problems: list[str], inventory_sources: list[str]) -> str:
    header = (f"engines not started: every node must hold the same verified model {plan.model_id}@{plan.revision[:12]}"
              f" in {plan.model_dir} (status Ready, same manifest digest); found:")
    fix = (f"Fix: run ansible-playbook -i {' -i '.join(inventory_sources)} playbooks/model.yml (it stages and "
           "re-verifies the model on every node and says how to restage a node whose copy differs), "
           "then run this again.")
    return "\n".join([header, *problems, fix])


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("plan", "reads"))
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _unused, args = self.validate_argument_spec(argument_spec={
            "plan": {"type": "dict", "required": True},
            "reads": {"type": "list", "elements": "dict", "required": True},
        })
        plan = Plan.from_dict(args["plan"])
        statuses = node_statuses(plan, args["reads"])
        # a branch (gms_model_allow_unpinned) is not compared with the commit the nodes resolved it to
        problems = readiness_gate(statuses, expected_revision=plan.revision if is_pinned(plan.revision) else None,
                                  expected_model_id=plan.model_id or None)
        host = task_vars.get("inventory_hostname", "")
        own = statuses.get(host) or {}
        decided_on = next((h for h in task_vars.get("ansible_play_hosts", []) if h in statuses), host)
        result.update(changed=False, problems=problems, decided_on=decided_on,
                      digest=str(own.get("digest") or ""))
        if not problems:
            result["msg"] = f"every node holds {plan.model_id}@{plan.revision[:12]} with the same manifest digest"
        elif host == decided_on and not self._task.check_mode:
            sources = list(task_vars.get("ansible_inventory_sources", []))
            result.update(failed=True, msg=gate_message(plan, problems, sources))
        else:
            result["msg"] = f"{len(problems)} problem(s) with the model; {decided_on} decides for the play"
        return result
