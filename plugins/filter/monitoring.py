# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The filter of the monitoring role: what it writes and starts, rendered from the plan by the library."""

from __future__ import annotations

from typing import Any, Callable

from ansible.errors import AnsibleFilterError
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.monitoring import role_view
from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.deployment.plan import Plan


def monitoring(plan: dict[str, Any]) -> dict[str, Any]:
    """Prometheus's files, targets and units of a deployment (gms_monitoring), from the cohort plan."""
    try:
        return role_view(Plan.from_dict(plan))
    except ValueError as err:
        raise AnsibleFilterError(f"shadowline.gms.monitoring: {err}") from err


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"monitoring": monitoring}
