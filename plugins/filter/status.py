# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The status table filter: cohort_info results of every node as one table."""

from __future__ import annotations

from typing import Any, Callable

from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.cluster.status_table import (
    render_status_table,
)


def status_table(results: list[dict[str, Any]], model: str = "") -> str:
    """results: the registered cohort_info result of every node."""
    ranks = [rank for result in results for rank in result.get("ranks", [])]
    holders = [result["lock_holder"] for result in results if result.get("lock_holder")]
    failover = next((result["failover"] for result in results if result.get("failover")), None)
    return render_status_table(ranks, holders[0] if holders else None, model, failover)


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"status_table": status_table}
