"""Live state of the cohorts' ranks on one node, read from systemd, the engines' system ports (/health, the
failover state and vLLM's progress metrics) and the failover lock: what real engines expose. Read-only.

States of a rank: ``parked`` (leader in standby: weights loaded, waiting for the lock), ``waking``,
``active`` (serving), ``starting`` (before standby), ``running`` (a headless rank: its process runs; a headless
rank shows nothing else), ``wedged`` (a leader whose /health does not answer, judged by policy.HangPolicy as
the agent judges it), ``dead`` (no process). A leader's entry also carries its ``requests_running`` and
``generated_tokens`` (vLLM's metrics), when it has them: a stall is a judgement over time, the agent's.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from ..common.failover_metrics import EngineFailoverView, engine_failover_view
from ..common.http import http_get
from ..common.lock import is_locked, read_holder
from ..common.policy import HangPolicy
from ..common.proc import argv_process, unit_properties
from ..common.progress import parse_sample
from ..deployment.plan import Plan

LEADER_STATES = {"standby": "parked", "waking": "waking", "active": "active", "init": "starting"}

__all__ = ["http_get", "leader_base", "leader_state", "leader_view", "lock_holder", "rank_states", "unit_status"]


def unit_status(unit: str, container: bool | None = None) -> dict[str, Any]:
    """ActiveState and the process of a systemd unit that runs the plan's argv ("inactive", 0 when systemd does
    not know it): proc.argv_process, ``container`` being whether the plan runs containers (None: not known)."""
    props = unit_properties(unit, "ActiveState", "SubState", "MainPID", "ControlGroup")
    return {"active_state": props.get("ActiveState", "unknown"), "sub_state": props.get("SubState", "unknown"),
            "pid": argv_process(props, container)}


def leader_base(plan: Plan, cohort: int) -> str:
    """The cohort leader's system server (``DYN_SYSTEM_HOST:DYN_SYSTEM_PORT``): /health, /metrics."""
    return plan.cohort(cohort).system_url


def leader_view(plan: Plan, cohort: int, timeout: float = 0.5) -> EngineFailoverView | None:
    """The leader's failover view (state, entered time, counters), None when it does not answer."""
    answer = http_get(plan.cohort(cohort).system_url + "/metrics", timeout)
    if answer is None or answer[0] != 200:
        return None
    return engine_failover_view(answer[1]).get(str(plan.cohort(cohort).engine_id))


def leader_state(plan: Plan, cohort: int, timeout: float = 0.5) -> str | None:
    view = leader_view(plan, cohort, timeout)
    return view.state if view else None


def lock_holder(lock_path: str) -> str | None:
    """``engine-<id>`` of the live holder, or None when no process holds the lock."""
    return read_holder(lock_path) if is_locked(lock_path) else None


def rank_states(plan: Plan, host: str, health_timeout_s: float = 1.0) -> list[dict[str, Any]]:
    """One entry per cohort rank on ``host``. A leader is ``wedged`` when /health gave no 200 for
    ``health_timeout_s`` (the probe waits that long): the agent's judgement (policy.HangPolicy)."""
    hang = HangPolicy(health_timeout_s=health_timeout_s, progress_stall_s=plan.failover.progress_stall_s)
    if host not in plan.hosts:
        return []  # an infra host runs no rank
    replica = plan.replica_of(host).id
    plan = plan.for_replica(replica)  # its ranks, leaders and ports are its replica's
    states = []
    for cohort in plan.cohorts:
        rank = next((r for r in cohort.ranks if r.host == host), None)
        if rank is None:
            continue
        unit = plan.unit_name("engine", cohort.cohort)
        status = unit_status(unit, plan.container)
        pid = status["pid"]
        entry: dict[str, Any] = {
            "cohort": cohort.cohort, "role": cohort.role, "replica": replica, "host": host, "rank": rank.node_rank,
            "leader": rank.leader, "unit": unit, "pid": pid, "health": None,
            "ports": asdict(cohort.ports),
        }
        if status["active_state"] not in ("active", "activating", "deactivating") or not pid:
            entry["state"] = "dead"
        elif rank.leader:
            entry.update(_leader_state(plan, cohort.cohort, hang))
        else:
            entry["state"] = "running"
        states.append(entry)
    return states


def _leader_state(plan: Plan, cohort: int, hang: HangPolicy) -> dict[str, Any]:
    base = plan.cohort(cohort).system_url
    asked = time.monotonic()
    health = http_get(f"{base}/health", hang.health_timeout_s)
    if health is None and hang.judge(None, time.monotonic() - asked):
        return {"state": "wedged", "health": "no answer"}
    if health is None:
        return {"state": "starting", "health": "no answer"}
    metrics = http_get(f"{base}/metrics", hang.health_timeout_s)
    views = engine_failover_view(metrics[1]) if metrics else {}
    view = views.get(str(plan.cohort(cohort).engine_id))
    state = LEADER_STATES.get(view.state or "", "starting") if view else "starting"
    entry: dict[str, Any] = {"state": state, "health": health[0]}
    sample = parse_sample(metrics[1]) if metrics else None
    if sample is not None:
        entry.update(requests_running=sample.running, generated_tokens=sample.tokens)
    return entry
