"""Planned or forced failover of a named cohort, the way an agent fails one: declare its generation failed in
etcd (one compare-and-swap, group-atomic: every agent tears its rank of that generation down), then follow
the driver's events on the leader node until another cohort is promoted (when the cohort served) and the slot
is refilled with a fresh shadow. A slot the agents gave up on (``dead``, a crash loop) is revived instead: a
new generation is launched with its crash-loop count reset.

``unfence`` removes a node's fence (written by its agent when a GPU fault took the GPU out of service): the driver
then relaunches the slots it held.

Reasons recorded in the slot and the events: ``planned-failover``, ``handover-failover`` or ``forced-failover``.
Planned and handover refuse to fail the serving cohort over when no parked shadow could take over (serving would
stop until the relaunch); forced does it anyway. Runs on the leader node (it reads the lock and the driver's event log there).

A handover of the serving cohort drains it first: its worker is taken out of the frontend's routing with its model
card kept (``discovery.deroute``: new requests meet 503s, which clients retry, not 404s), the streams on it end
on it (until the leader's metrics count none running, at most ``planned_grace_s``), and only then is it declared
failed and ended at once; a successor's lock, wake and registration follow. Without the drain a stream in
flight at the kill had nowhere to migrate (no live worker registered yet) and failed in the middle, which no
client retries. Anything that stops the handover before the declaration puts the worker back into routing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from ..cluster.access import operator_etcd
from ..cluster.cohort_state import lock_holder
from ..cluster.discovery import cohort_registrations, deroute, reroute, revoke_leases
from ..common.coordination import DEAD, FAILED, LAUNCHING, RUNNING, Coordination, Keys, Slot
from ..common.etcd_client import KV, Etcd, EtcdError
from ..common.events import read_events
from ..common.lock import parse_holder
from ..common.proc import cgroup_pids, listening_ports, unit_cgroup
from ..common.progress import ProgressSample
from ..deployment.plan import Plan, sole_replica
from .observe import installed_configs, leader_progress
from .view import pause_record

# planned: SIGTERM and planned_grace_s (the engines drain); handover: the same refusal, the drain above (at most
# planned_grace_s), then term_grace_s (at once); forced: no refusal, term_grace_s. A draining Dynamo 1.6.1 engine
# deregisters itself, and the frontend drops the model until the successor registers (404, which no client
# retries); a derouted one keeps its card until the agents see its successor, so the window is 503s, which clients
# retry (docs/drills.md, Upgrades).
MODES = ("planned", "handover", "forced")
DRAIN_SETTLE_S = 0.05  # after the deroute: a request the frontend routed just before it has reached the engine
DRAIN_POLL_S = 0.02  # how often the draining leader's metrics are read


class FailoverError(Exception):
    """A failover cannot be done as asked (or now); the message says why and what to do."""


def describe(slots: dict[int, tuple[Slot, int]], holder: str | None) -> str:
    """The slots and the lock holder as lines (the module's diff)."""
    lines = [f"lock holder: {holder or 'nobody'}"]
    for cohort, (slot, _rev) in sorted(slots.items()):
        lines.append(f"cohort {cohort}: generation {slot.generation} {slot.state}"
                     + (f" ({slot.reason})" if slot.reason else "") + (f", attempts {slot.attempts}" if slot.attempts else ""))
    return "\n".join(lines) + "\n"


def plan_failover(plan: Plan, cohort: int, mode: str) -> dict[str, Any]:
    """What a failover of ``cohort`` would do now: {action, slot, revision, slots, holder, serving, after}."""
    if mode not in MODES:
        raise FailoverError(f"mode={mode!r}: planned, handover or forced")
    if not plan.has_cohort(cohort):
        raise FailoverError(f"cohort {cohort} is not in the plan (cohorts 0..{len(plan.cohorts) - 1})")
    try:
        coord = Coordination(operator_etcd(plan), plan.deployment, sole_replica(plan))
        slots = coord.slots()
    except EtcdError as err:
        raise FailoverError(f"etcd does not answer: {err}") from None
    if cohort not in slots:
        raise FailoverError(f"cohort {cohort} has no slot in etcd: do the agents run? (playbooks/site.yml)")
    slot, revision = slots[cohort]
    holder = lock_holder(plan.lock_path)
    serving = parse_holder(holder or "")
    parked = [c for c, (s, _r) in slots.items() if c != cohort and s.state == RUNNING and c != serving]
    after = {c: (Slot(**{**s.__dict__}), r) for c, (s, r) in slots.items()}
    if slot.state == DEAD:
        action = "revive"
        after[cohort] = (Slot(cohort=cohort, generation=slot.generation + 1, state=LAUNCHING,
                              reason=f"{mode}-failover: revived"), 0)
    elif slot.state in (RUNNING, LAUNCHING):
        if mode in ("planned", "handover") and cohort == serving and not parked:
            raise FailoverError(f"cohort {cohort} serves and no shadow is parked to take over: a planned failover "
                                "would stop serving until the relaunch. Fix: wait for a parked shadow "
                                "(playbooks/status.yml), or use mode=forced")
        action = "fail over"
        after[cohort] = (Slot(cohort=cohort, generation=slot.generation, state=FAILED,
                              reason=f"{mode}-failover"), 0)
    else:
        action = "wait"  # already failed: the agents are on it
    new_holder = holder
    if action == "fail over" and cohort == serving:
        new_holder = f"engine-{parked[0]}" if parked else None
    return {"action": action, "slot": slot, "revision": revision, "slots": slots, "holder": holder,
            "serving": serving, "parked": parked, "coord": coord,
            "diff": {"before": describe(slots, holder), "after": describe(after, new_holder)}}


def drain(read_running: Callable[[], float | None], grace_s: float, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """After the deroute: wait until the engine has nothing running, at most ``grace_s``. ``read_running``: the
    requests running now, None when the engine cannot tell (no such metrics, no answer): then only the settle.
    Returns {drain_s, running_left}."""
    start = clock()
    sleep(min(DRAIN_SETTLE_S, grace_s))
    while True:
        running = read_running()
        if running is None or running <= 0 or clock() - start >= grace_s:
            return {"drain_s": round(clock() - start, 3), "running_left": running}
        sleep(DRAIN_POLL_S)


def leader_running(plan: Plan, cohort: int) -> float | None:
    """The requests the cohort's leader runs now (common/progress.py: vLLM's gauge or Dynamo's handler gauge,
    the larger); None when its metrics do not say."""
    sample = leader_progress(plan, cohort, 0.5)
    return sample.running if isinstance(sample, ProgressSample) else None


def take_out_of_routing(plan: Plan, etcd: Etcd, cohort: int) -> list[KV]:
    """Deroute the cohort's leader (on this node: its registration is found by the ports its unit listens on too)."""
    cgroup = unit_cgroup(plan.unit_name("engine", cohort))
    ports = listening_ports(cgroup_pids(cgroup)) if cgroup else set()
    return deroute(etcd, [r.lease for r in cohort_registrations(etcd, plan, cohort, ports)])


def run_failover(plan: Plan, cohort: int, mode: str, host: str, wait: bool = True,
                 timeout_s: float = 120.0) -> dict[str, Any]:
    """Do it and (``wait``) follow it to the end. Returns the timeline, times relative to the declaration (a
    handover's drain comes before it: ``drain``)."""
    planned = plan_failover(plan, cohort, mode)
    coord: Coordination = planned["coord"]
    slot: Slot = planned["slot"]
    reason = f"{mode}-failover"
    derouted: list[KV] = []
    drained: dict[str, Any] = {}
    if planned["action"] == "revive":
        revived = Slot(cohort=cohort, generation=slot.generation + 1, state=LAUNCHING,
                       reason=f"{reason}: revived by {host}", attempts=0,
                       config=installed_configs(plan).get(cohort, ""))  # this node's unit files'; every node's must agree
        if not coord.swap(revived, planned["revision"]):
            raise FailoverError(f"cohort {cohort}'s slot changed while reviving it; run it again")
    elif planned["action"] == "fail over":
        drain_first = mode == "handover" and planned["serving"] == cohort
        derouted, drained = declare(plan, coord, slot, reason, host, drain_first)
    start = time.time()
    result: dict[str, Any] = {
        "action": planned["action"], "cohort": cohort, "reason": reason, "declared_at": start,
        "generation_before": slot.generation, "state_before": slot.state, "serving_before": planned["holder"],
        "diff": planned["diff"],
    }
    if derouted:
        result["drain"] = {"derouted": len(derouted), **drained}
    if not wait:
        return result
    result.update(follow(plan, coord, cohort, slot.generation, planned["serving"] == cohort, start, timeout_s))
    if derouted and result["timeline"]["promote_s"] is not None:
        try:  # the agents revoke it too once the successor registered; a stand-in's is found by its ports only
            revoke_leases(coord.etcd, {kv.lease for kv in derouted})
        except EtcdError:
            pass
    return result


def declare(plan: Plan, coord: Coordination, slot: Slot, reason: str, host: str,
            drain_first: bool) -> tuple[list[KV], dict[str, Any]]:
    """Declare the slot's generation failed (``drain_first``: after taking it out of routing and draining it; put
    back into routing when the declaration does not happen). Returns the records derouted and the drain."""
    derouted: list[KV] = []
    drained: dict[str, Any] = {}
    declared = None
    try:
        if drain_first:
            derouted = take_out_of_routing(plan, coord.etcd, slot.cohort)
            if derouted:
                drained = drain(lambda: leader_running(plan, slot.cohort), plan.failover.planned_grace_s)
        declared = coord.declare_failed(slot.cohort, slot.generation, reason, host)
    except EtcdError as err:
        raise FailoverError(f"etcd: {err}; cohort {slot.cohort} goes on serving") from None
    finally:
        if declared is None and derouted:
            reroute(coord.etcd, derouted)
    if declared is None:
        raise FailoverError(f"cohort {slot.cohort} generation {slot.generation} was declared failed by someone "
                            "else (or changed) just now; run it again")
    return derouted, drained


def follow(plan: Plan, coord: Coordination, cohort: int, generation: int, was_serving: bool, since: float,
           timeout_s: float) -> dict[str, Any]:
    """Watch the driver's events until the slot is refilled (and, if it served, another cohort promoted)."""
    path = plan.events_path
    deadline = time.time() + timeout_s
    seen: dict[str, Any] = {}
    while True:
        for event in read_events(path, since - 0.001):
            name, c, g = event["event"], event.get("cohort"), event.get("generation") or 0
            if name == "generation-gone" and c == cohort and g == generation:
                seen.setdefault("gone", event)
            elif name == "promoted" and was_serving and (c != cohort or g > generation):
                seen.setdefault("promoted", event)
            elif name == "relaunch-complete" and c == cohort and g > generation:
                seen.setdefault("relaunched", event)
            elif name == "slot-dead" and c == cohort:
                seen.setdefault("dead", event)
        done = ("relaunched" in seen or "dead" in seen) and (not was_serving or "promoted" in seen)
        if done or time.time() >= deadline:
            break
        time.sleep(0.1)
    slot, _rev = coord.slot(cohort)
    holder = lock_holder(plan.lock_path)

    def rel(key: str) -> float | None:
        return round(seen[key]["time"] - since, 3) if key in seen else None

    gone = seen.get("gone", {}).get("detail", {})
    out = {
        "completed": "relaunched" in seen and (not was_serving or "promoted" in seen),
        "timeline": {
            "generation_gone_s": rel("gone"),
            "teardown_per_node": gone.get("per_node", {}),
            "promote_s": rel("promoted"),
            "promoted_cohort": seen["promoted"]["cohort"] if "promoted" in seen else None,
            "relaunch_s": rel("relaunched"),
            "slot_dead_s": rel("dead"),
        },
        "generation_after": slot.generation if slot else None,
        "state_after": slot.state if slot else None,
        "serving_after": holder,
    }
    if not out["completed"]:
        missing = [what for what, key in (("the promotion", "promoted"), ("the relaunch", "relaunched"))
                   if key not in seen and (key != "promoted" or was_serving)]
        out["waiting_for"] = missing
    return out


def unfence(plan: Plan, node: str, check: bool = False) -> dict[str, Any]:
    """Remove ``node``'s fence (once its GPU was reset or the node serviced); the held slots relaunch by
    themselves. Returns {changed, fence (the record that was there, or None)}; ``check``: change nothing."""
    if node not in plan.hosts:
        raise FailoverError(f"unfence={node}: not a node of deployment {plan.deployment} "
                            f"(nodes: {', '.join(plan.hosts)})")
    try:
        coord = Coordination(operator_etcd(plan), plan.deployment, plan.replica_of(node).id)
        kv = coord.etcd.get(coord.keys.fenced(node))
        if kv is None:
            return {"changed": False, "fence": None}
        if not check:
            coord.etcd.delete(coord.keys.fenced(node))
    except EtcdError as err:
        raise FailoverError(f"etcd does not answer: {err}") from None
    try:
        record = json.loads(kv.value)
    except ValueError:
        record = {"detail": kv.value.decode(errors="replace")}
    return {"changed": True, "fence": record}


def set_paused(plan: Plan, paused: bool, reason: str = "", by: str = "", check: bool = False) -> dict[str, Any]:
    """Pause automatic failover (the ``paused`` key: control/pause.py) or resume it. Returns {changed, before
    (the pause record that was there, or None), after}; ``check``: change nothing. Pausing again keeps the first
    record (its time and reason): a pause is one maintenance window until it is resumed. A deployment's pause is
    one record per replica (each replica's agents read their own): written and removed for every replica."""
    try:
        etcd = operator_etcd(plan)
        keys = [Keys(plan.deployment, replica.id).paused() for replica in plan.replicas]
        records = {key: _pause_in(etcd, key) for key in keys}
        before = next((r for r in records.values() if r is not None), None)
        if paused and any(r is None for r in records.values()):
            after: dict[str, Any] | None = before or {"by": by, "since": time.time(), "reason": reason}
            if not check:
                for key in (k for k, r in records.items() if r is None):
                    etcd.put(key, json.dumps(after))
        elif not paused and before is not None:
            after = None
            if not check:
                for key in (k for k, r in records.items() if r is not None):
                    etcd.delete(key)
        else:
            return {"changed": False, "before": before, "after": before}
    except EtcdError as err:
        raise FailoverError(f"etcd does not answer: {err}") from None
    return {"changed": True, "before": before, "after": after}


def paused_record(plan: Plan) -> dict[str, Any] | None:
    """The deployment's pause record (control/pause.py: the first replica's that has one), None while automatic
    failover runs in every replica. An operator's read (cluster/access.operator_etcd)."""
    try:
        etcd = operator_etcd(plan)
        records = (_pause_in(etcd, Keys(plan.deployment, replica.id).paused()) for replica in plan.replicas)
        return next((r for r in records if r is not None), None)
    except EtcdError as err:
        raise FailoverError(f"etcd does not answer: {err}") from None


def _pause_in(etcd: Etcd, key: str) -> dict[str, Any] | None:
    kv = etcd.get(key)
    return pause_record(kv.value) if kv is not None else None
