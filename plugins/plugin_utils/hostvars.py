# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading the inventory contract out of Ansible's hostvars, for the controller-side action plugins."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleError
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.common.problems import Problem

HOST_KEYS = ("ansible_host", "python_env_mode")  # python_env_mode: container changes the plan (deployment/container.py)


def contract_hosts(task_vars: dict[str, Any], nodes_group: str, infra_group: str,
                   spares_group: str) -> tuple[list[str], list[str], list[str]]:
    """The hosts of the deployment's groups: its nodes, its infra hosts and its spare nodes."""
    groups = task_vars.get("groups", {})
    return list(groups.get(nodes_group, [])), list(groups.get(infra_group, [])), list(groups.get(spares_group, []))


def read_host(task_vars: dict[str, Any], host: str, problems: list[Problem],
              extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The gms_* variables (and ansible_host, and ``extra`` names) of one host, templated, as plain values.

    A variable whose template fails becomes a problem naming it, instead of a traceback.
    """
    hostvars = task_vars.get("hostvars", {}).get(host)
    if hostvars is None:
        problems.append(Problem("(inventory)", "host is listed in a group but has no variables.",
                                "check the inventory for this host.", host=host))
        return {}
    values: dict[str, Any] = {}
    names = [n for n in hostvars.keys() if n.startswith("gms_") and n != "gms_plan"] + list(HOST_KEYS) + list(extra)
    for name in names:
        if name not in hostvars:
            continue
        try:
            values[name] = plain(hostvars[name])
        except AnsibleError as err:
            problems.append(Problem(name, f"cannot be evaluated: {err.message}",
                                    "fix the Jinja expression or the variable it refers to.", host=host))
    return values


def plain(value: Any) -> Any:
    """Tagged or lazy Ansible values as plain Python types, so the library sees what the user wrote."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value
