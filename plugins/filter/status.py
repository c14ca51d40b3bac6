# -*- coding: utf-8 -*-
# Copyright: shadowline contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The status table filter: cohort_info results of every node as one table."""

from __future__ import annotations

from typing import Any, Callable

from ansible_collections.shadowline.gms.plugins.module_utils.shadowline.cluster.status_table import (
    render_status_table,
    replicas_of,
)


def status_table(results: list[dict[str, Any]], model: str = "") -> str:
    """results: the registered cohort_info result of every node."""
    ranks = [rank for result in results for rank in result.get("ranks", [])]
    holders = {leader.get("replica", 0): result["lock_holder"] for result in results if result.get("lock_holder")
               for leader in result.get("ranks", [])[:1]}  # a leader node's result: its replica's lock
    failover = next((result["failover"] for result in results if result.get("failover")), None)
    spares = [result["spare"] for result in results if result.get("spare")]
    if len(replicas_of(ranks)) > 1:
        return render_status_table(ranks, holders, model, failover, spares)
    return render_status_table(ranks, next(iter(holders.values()), None), model, failover, spares)


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"status_table": status_table}
