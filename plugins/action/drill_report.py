# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of shadowline.gms.drill_report: the drill report from what the drill recorded on every node,
written as JSON (and its timeline as SVG beside it), and the table a person reads."""

from __future__ import annotations

import json
import os
from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import Plan
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.drill.report import compute_report
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.drill.report_text import render_timeline_table
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.drill.svg import render_svg


def replica_of_workers(fleet: Plan, seen: list[dict[str, Any]]) -> dict[str, int | None]:
    """{worker instance id: replica} from what discovery showed (``seen``: {instance id: request-plane host
    address}, before and after the fault) and the deployment's plan: a worker's address is a node's, whose replica
    the plan says (None: an address of no node)."""
    replica_of_address = {fleet.node(host).address: replica.id for replica in fleet.replicas for host in replica.members}
    return {worker: replica_of_address.get(address or "") for found in seen for worker, address in found.items()}


def build_evidence(args: dict[str, Any]) -> dict[str, Any]:
    """The evidence dict of ``compute_report`` from the results the drill's tasks registered."""
    plan = Plan.from_dict(args["plan"])
    nodes = plan.hosts  # in rank order
    injected, restored = dict(args["injected"]), dict(args.get("restored") or {})
    steady = args["steady"]
    before = {h: r for h, r in (args.get("before") or {}).items() if isinstance(r, dict)}
    after = {h: r for h, r in (args.get("after") or {}).items() if isinstance(r, dict)}
    leader_after = next((r.get("state") for r in after.values() if r.get("leader") and r.get("state")), {}) or {}
    fault = {k: injected.get(k) for k in ("fault", "host", "cohort", "unit", "pids", "action", "injected_at")}
    fault["name"] = fault.pop("fault") or args.get("fault")
    if restored.get("cut"):
        fault["cut"] = restored["cut"]
    settle = args.get("settle") or {}
    return {
        "fault": fault, "nodes": nodes, "cohorts": len(plan.cohorts),
        "before": {"holder": steady["state"]["lock_holder"], "slots": steady["state"]["slots"],
                   "leaders": steady["state"]["leaders"],
                   "processes": {h: r.get("processes", {}) for h, r in before.items()},
                   "agents": {h: r.get("agent", {}) for h, r in before.items()},
                   "gms": {h: r.get("gms", {}) for h, r in before.items()}},
        "after": {"holder": leader_after.get("lock_holder"), "slots": leader_after.get("slots"),
                  "leaders": leader_after.get("leaders"),
                  "survivors": {h: r.get("survivors", []) for h, r in after.items()},
                  "agents": {h: r.get("agent", {}) for h, r in after.items()},
                  "gms": {h: r.get("gms", {}) for h, r in after.items()},
                  "settled": bool(settle.get("settled")), "settle_note": settle.get("note", "")},
        "events": [e for r in after.values() for e in r.get("events", [])],
        "requests": list(args.get("requests") or []),
        "workers": replica_of_workers(Plan.from_dict(args.get("fleet") or args["plan"]),
                                      [steady.get("workers") or {}]
                                      + [r.get("workers") or {} for r in after.values() if r.get("leader")]),
        "restored": {"unfenced": bool(restored.get("unfenced")),
                     "steady_after_unfence": bool(restored.get("steady_after_unfence"))},
    }


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("plan", "fleet", "fault", "injected", "restored", "steady", "before", "settle", "after",
                             "requests", "path", "svg"))
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = self._task.args
        missing = [k for k in ("plan", "injected", "steady") if not args.get(k)]
        if missing:
            result.update(failed=True, msg=f"drill_report needs {', '.join(missing)}")
            return result
        evidence = build_evidence(args)
        report = compute_report(evidence)
        report["evidence"] = evidence
        lines = render_timeline_table(report)
        path = args.get("path")
        if path and not self._play_context.check_mode:
            path = os.path.abspath(os.path.expanduser(str(path)))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(report, handle, indent=1, sort_keys=True)
                handle.write("\n")
            svg = args.get("svg") or (path[:-5] if path.endswith(".json") else path) + ".svg"
            with open(svg, "w", encoding="utf-8") as handle:
                handle.write(render_svg(report, evidence["requests"], evidence["nodes"]))
            result.update(path=path, svg=svg)
        public = {k: v for k, v in report.items() if k not in ("evidence", "timeline")}
        result.update(changed=False, report=public, lines=lines, passed=report["passed"],
                      problems=report["problems"])
        return result
