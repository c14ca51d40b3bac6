# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of shadowline.gms.preflight: reads every node's variables and facts, checks them all."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.common.problems import (
    Problem,
    format_problems,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.contract import missing_group_problem
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.preflight import run_preflight
from ansible_collections.shadowline.gms.plugins.plugin_utils.hostvars import contract_hosts, read_host


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("nodes_group", "infra_group", "spares_group", "facts_name"))
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        facts_name = self._task.args.get("facts_name", "shadowline_node")
        nodes_group = self._task.args.get("nodes_group", "gms_nodes")
        node_hosts, infra_hosts, spare_hosts = contract_hosts(task_vars, nodes_group,
                                                              self._task.args.get("infra_group", "gms_infra"),
                                                              self._task.args.get("spares_group", "gms_spares"))
        if not node_hosts:  # (playbooks/preflight.yml refuses this in its first play, before any host is reached)
            problem = missing_group_problem(nodes_group, task_vars.get("groups"))
            result.update(failed=True, changed=False, checks=[], problems=[problem.to_dict()],
                          msg=format_problems([problem]))
            return result
        problems: list[Problem] = []
        hostvars: dict[str, dict[str, Any]] = {}
        facts: dict[str, dict[str, Any] | None] = {}
        for host in dict.fromkeys(node_hosts + infra_hosts + spare_hosts):
            values = read_host(task_vars, host, problems, extra=(facts_name,))
            facts[host] = values.pop(facts_name, None)
            hostvars[host] = values

        outcome = run_preflight(hostvars, node_hosts, infra_hosts, facts, spare_hosts)
        problems = problems + outcome.problems
        result.update(changed=False, checks=outcome.checks, problems=[p.to_dict() for p in problems])
        if problems:
            result.update(failed=True, msg=format_problems(problems))
            return result
        if not (outcome.plan is not None):
            raise AssertionError("unreachable: checked above")
        result["plan"] = outcome.plan.to_dict()
        if outcome.warnings:
            result["warnings"] = outcome.warnings
        result["msg"] = (f"preflight passed for deployment {outcome.plan.deployment}: "
                         f"{len(node_hosts)} node(s), " + (f"{len(spare_hosts)} spare(s), " if spare_hosts else "")
                         + f"{len(outcome.plan.cohorts)} cohort(s), "
                         f"backend {outcome.plan.backend}; checked " + "; ".join(outcome.checks) + ".")
        return result
