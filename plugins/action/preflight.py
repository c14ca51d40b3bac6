# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of shadowline.gms.preflight: reads every node's variables and facts, checks them all."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.preflight import run_preflight
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.problems import Problem, format_problems

HOST_KEYS = ("ansible_host",)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("nodes_group", "infra_group", "facts_name"))
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        nodes_group = self._task.args.get("nodes_group", "gms_nodes")
        infra_group = self._task.args.get("infra_group", "gms_infra")
        facts_name = self._task.args.get("facts_name", "shadowline_node")
        groups = task_vars.get("groups", {})
        node_hosts = list(groups.get(nodes_group, []))
        infra_hosts = list(groups.get(infra_group, []))

        problems: list[Problem] = []
        hostvars: dict[str, dict[str, Any]] = {}
        facts: dict[str, dict[str, Any] | None] = {}
        for host in dict.fromkeys(node_hosts + infra_hosts):
            hostvars[host], facts[host] = self._read_host(task_vars, host, facts_name, problems)

        outcome = run_preflight(hostvars, node_hosts, infra_hosts, facts)
        problems = problems + outcome.problems
        result.update(changed=False, checks=outcome.checks, problems=[p.to_dict() for p in problems])
        if problems:
            result.update(failed=True, msg=format_problems(problems))
            return result
        assert outcome.plan is not None
        result["plan"] = outcome.plan.to_dict()
        result["msg"] = (f"preflight passed for deployment {outcome.plan.deployment}: "
                         f"{len(node_hosts)} node(s), {len(outcome.plan.cohorts)} cohort(s), "
                         f"backend {outcome.plan.backend}; checked " + "; ".join(outcome.checks) + ".")
        return result

    def _read_host(self, task_vars: dict[str, Any], host: str, facts_name: str,
                   problems: list[Problem]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The contract variables of one host, templated; a variable that fails to template is a problem."""
        hostvars = task_vars.get("hostvars", {}).get(host)
        if hostvars is None:
            problems.append(Problem("(inventory)", "host is listed in a group but has no variables.",
                                    "check the inventory for this host.", host=host))
            return {}, None
        values: dict[str, Any] = {}
        names = [n for n in hostvars.keys() if n.startswith("gms_")] + list(HOST_KEYS)
        for name in names:
            if name not in hostvars:
                continue
            try:
                values[name] = _plain(hostvars[name])
            except AnsibleError as err:
                problems.append(Problem(name, f"cannot be evaluated: {err.message}",
                                        "fix the Jinja expression or the variable it refers to.", host=host))
        facts = None
        if facts_name in hostvars:
            try:
                facts = _plain(hostvars[facts_name])
            except AnsibleError:
                facts = None
        return values, facts


def _plain(value: Any) -> Any:
    """Tagged or lazy Ansible values as plain Python types, so the library sees what the user wrote."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


