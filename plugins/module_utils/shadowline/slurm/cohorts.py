"""What a cohort's leader says about itself: its failover state from ``/metrics`` on its system port."""

from __future__ import annotations

from typing import Any

from ..cohort_state import http_get
from ..failover_metrics import EngineFailoverView, engine_failover_view


def leader_base(plan: dict[str, Any], cohort: int) -> str:
    entry = plan["cohorts"][cohort]
    leader = next(r for r in entry["ranks"] if r["leader"])
    return f"http://{leader['address']}:{entry['ports']['system']}"


def leader_view(plan: dict[str, Any], cohort: int, timeout: float = 0.5) -> EngineFailoverView | None:
    """The leader's failover view (state, entered time, counters), None when it does not answer."""
    answer = http_get(leader_base(plan, cohort) + "/metrics", timeout)
    if answer is None or answer[0] != 200:
        return None
    return engine_failover_view(answer[1]).get(str(plan["cohorts"][cohort]["engine_id"]))


def leader_state(plan: dict[str, Any], cohort: int, timeout: float = 0.5) -> str | None:
    view = leader_view(plan, cohort, timeout)
    return view.state if view else None
