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
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..deployment.plan import Plan
from .access import etcd_for
from .cohort_state import lock_holder
from .coordination import DEAD, FAILED, LAUNCHING, RUNNING, Coordination, Slot
from .etcd_client import EtcdError
from .events import read_events
from .lock import parse_holder

# planned: SIGTERM and planned_grace_s (the engines drain); handover: the same refusal, then term_grace_s (at once);
# forced: no refusal, term_grace_s. A draining Dynamo 1.6.1 engine deregisters itself, and the frontend drops the
# model until the successor registers (404, which no client retries); one ended at once stays registered until
# the agents see its successor, so the window is 503s, which clients retry (docs/drills.md, Upgrades).
MODES = ("planned", "handover", "forced")


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
        coord = Coordination(etcd_for(plan), plan.deployment)
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


def run_failover(plan: Plan, cohort: int, mode: str, host: str, wait: bool = True,
                 timeout_s: float = 120.0) -> dict[str, Any]:
    """Do it and (``wait``) follow it to the end. Returns the timeline, times relative to the declaration."""
    planned = plan_failover(plan, cohort, mode)
    coord: Coordination = planned["coord"]
    slot: Slot = planned["slot"]
    reason = f"{mode}-failover"
    start = time.time()
    if planned["action"] == "revive":
        revived = Slot(cohort=cohort, generation=slot.generation + 1, state=LAUNCHING,
                       reason=f"{reason}: revived by {host}", attempts=0)
        if not coord.swap(revived, planned["revision"]):
            raise FailoverError(f"cohort {cohort}'s slot changed while reviving it; run it again")
        failed_generation = slot.generation
    elif planned["action"] == "fail over":
        if coord.declare_failed(cohort, slot.generation, reason, host) is None:
            raise FailoverError(f"cohort {cohort} generation {slot.generation} was declared failed by someone else "
                                "(or changed) just now; run it again")
        failed_generation = slot.generation
    else:
        failed_generation = slot.generation
    result: dict[str, Any] = {
        "action": planned["action"], "cohort": cohort, "reason": reason, "declared_at": start,
        "generation_before": slot.generation, "state_before": slot.state, "serving_before": planned["holder"],
        "diff": planned["diff"],
    }
    if not wait:
        return result
    result.update(follow(plan, coord, cohort, failed_generation, planned["serving"] == cohort, start, timeout_s))
    return result


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
        coord = Coordination(etcd_for(plan), plan.deployment)
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
