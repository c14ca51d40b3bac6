# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of shadowline.gms.cohort_plan: the cohort plan from the inventory, as the fact gms_plan."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.common.problems import (
    Problem,
    format_problems,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.contract import (
    missing_group_problem,
    parse_contract,
)
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan_builder import checked_plan
from ansible_collections.shadowline.gms.plugins.plugin_utils.hostvars import contract_hosts, read_host


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("nodes_group", "infra_group", "spares_group"))
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        nodes_group = self._task.args.get("nodes_group", "gms_nodes")
        node_hosts, infra_hosts, spare_hosts = contract_hosts(task_vars, nodes_group,
                                                              self._task.args.get("infra_group", "gms_infra"),
                                                              self._task.args.get("spares_group", "gms_spares"))
        problems: list[Problem] = []
        if not node_hosts:
            problems.append(missing_group_problem(nodes_group, task_vars.get("groups")))
        hostvars = {host: read_host(task_vars, host, problems)
                    for host in dict.fromkeys(node_hosts + infra_hosts + spare_hosts)}
        contract, parse_problems = (parse_contract(hostvars, node_hosts, infra_hosts, spare_hosts) if node_hosts
                                    else (None, []))
        problems += parse_problems
        built, refused = checked_plan(contract) if contract is not None and not problems else (None, [])
        problems += refused
        if problems or built is None:
            result.update(failed=True, changed=False, msg=format_problems(problems, "the cohort plan"))
            return result
        plan = built.to_dict()
        result.update(changed=False, plan=plan, ansible_facts={"gms_plan": plan})
        return result
