# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filter of playbooks/preflight.yml's first play: the deployment's group of nodes exists and has hosts."""

from __future__ import annotations

from typing import Any, Callable

from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.common.problems import format_problems
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.contract import (
    NODES_GROUP,
    missing_group_problem,
)


def group_problem(groups: dict[str, Any], group: str = NODES_GROUP) -> str:
    """Empty when ``group`` has hosts; else preflight's refusal naming the group, the groups the inventory has and
    the closest of them (deployment.contract.missing_group_problem)."""
    if list((groups or {}).get(group) or []):
        return ""
    return format_problems([missing_group_problem(group, {str(k): list(v or []) for k, v in (groups or {}).items()})])


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"group_problem": group_problem}
