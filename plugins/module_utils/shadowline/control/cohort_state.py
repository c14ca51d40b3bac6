"""Live state of the cohorts' ranks on one node, read from systemd, the engines' system ports, the
failover lock and (for the stand-in) the collective heartbeat files. Read-only.

States of a rank: ``parked`` (leader in standby: weights loaded, waiting for the lock), ``waking``,
``active`` (serving), ``starting`` (before standby), ``running`` (a headless rank whose collective
progresses), ``wedged`` (alive but its health or heartbeat does not answer), ``dead`` (no process).
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from typing import Any

from .failover_metrics import EngineFailoverView, engine_failover_view
from .lock import is_locked, read_holder
from .proc import unit_properties
from ..standin.settings import heartbeat_path
from ..deployment.plan import Plan, RankPlan

LEADER_STATES = {"standby": "parked", "waking": "waking", "active": "active", "init": "starting"}


def unit_status(unit: str) -> dict[str, Any]:
    """ActiveState and MainPID of a systemd unit ("inactive", 0 when systemd does not know it)."""
    props = unit_properties(unit, "ActiveState", "SubState", "MainPID")
    return {"active_state": props.get("ActiveState", "unknown"), "sub_state": props.get("SubState", "unknown"),
            "pid": int(props.get("MainPID", "0") or 0)}


def http_get(url: str, timeout: float) -> tuple[int, str] | None:
    """(status, body) or None when nothing answers within the timeout."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (plan URLs only)
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, ""
    except (OSError, ValueError):
        return None


def leader_base(plan: Plan | dict[str, Any], cohort: int) -> str:
    """The cohort leader's system server (``DYN_SYSTEM_HOST:DYN_SYSTEM_PORT``): /health, /metrics."""
    return Plan.from_dict(plan).cohort(cohort).system_url


def leader_view(plan: Plan | dict[str, Any], cohort: int, timeout: float = 0.5) -> EngineFailoverView | None:
    """The leader's failover view (state, entered time, counters), None when it does not answer."""
    entry = Plan.from_dict(plan).cohort(cohort)
    answer = http_get(entry.system_url + "/metrics", timeout)
    if answer is None or answer[0] != 200:
        return None
    return engine_failover_view(answer[1]).get(str(entry.engine_id))


def leader_state(plan: Plan | dict[str, Any], cohort: int, timeout: float = 0.5) -> str | None:
    view = leader_view(plan, cohort, timeout)
    return view.state if view else None


def lock_holder(lock_path: str) -> str | None:
    """``engine-<id>`` of the live holder, or None when no process holds the lock."""
    return read_holder(lock_path) if is_locked(lock_path) else None


def rank_states(plan: Plan, host: str, health_timeout_s: float = 1.0,
                heartbeat_stall_s: float = 3.0) -> list[dict[str, Any]]:
    """One entry per cohort rank on ``host``."""
    states = []
    for cohort in plan.cohorts:
        rank = next((r for r in cohort.ranks if r.host == host), None)
        if rank is None:
            continue
        unit = plan.unit_name("engine", cohort.cohort)
        status = unit_status(unit)
        entry: dict[str, Any] = {
            "cohort": cohort.cohort, "role": cohort.role, "host": host, "rank": rank.node_rank,
            "leader": rank.leader, "unit": unit, "pid": status["pid"], "health": None,
            "ports": asdict(cohort.ports),
        }
        if status["active_state"] not in ("active", "activating", "deactivating") or not status["pid"]:
            entry["state"] = "dead"
        elif rank.leader:
            entry.update(_leader_state(rank, health_timeout_s))
        else:
            entry["state"] = _headless_state(plan, cohort.engine_id, rank, heartbeat_stall_s)
        states.append(entry)
    return states


def _leader_state(rank: RankPlan, timeout: float) -> dict[str, Any]:
    env = rank.process.env
    base = f"http://{env['DYN_SYSTEM_HOST']}:{env['DYN_SYSTEM_PORT']}"
    health = http_get(f"{base}/health", timeout)
    if health is None:
        return {"state": "wedged", "health": "no answer"}
    metrics = http_get(f"{base}/metrics", timeout)
    views = engine_failover_view(metrics[1]) if metrics else {}
    view = views.get(env["ENGINE_ID"])
    state = LEADER_STATES.get(view.state or "", "starting") if view else "starting"
    return {"state": state, "health": health[0]}


def _headless_state(plan: Plan, engine_id: int, rank: RankPlan, stall_s: float) -> str:
    """A headless rank shows progress only through the stand-in's collective heartbeat file."""
    if plan.backend != "standin":
        return "running"
    path = heartbeat_path(str(engine_id), rank.node_rank, plan.lock_dir)
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return "starting"
    return "running" if age <= stall_s else "wedged"
