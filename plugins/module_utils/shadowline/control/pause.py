"""Automatic failover paused for maintenance, as patronictl's pause: what the agents hold while it is.

An operator pauses a deployment (``playbooks/pause.yml``, ``shadowline pause``): the ``paused`` key in etcd. While
it is there every agent still watches, probes and reports, but it declares no generation failed (so no node tears
a cohort down and no failure notice is sent) and the driver makes no slot change that fails over (no relaunch, no
repair of a broken record, no crash-loop verdict; a launch already under way is still recorded as running). Both
are held here, at the executor's door, as events (``failover-held``), once each. What an operator does meanwhile
still happens: a failover.yml they run declares the cohort, and every agent tears its rank down as always. What
the kernel does still happens: a dead primary's lock passes to a parked shadow, which wakes.

On resume (the key removed) each agent restarts itself and reconciles what it finds, as after any restart of its
own (docs/reliability.md: a rank that died meanwhile is found missing and declared; running ranks are adopted):
a decision held while paused is never half remembered.
"""

from __future__ import annotations

import time

from .actions import Action, Declare, Record, SwapSlot

HELD = "failover-held"
HELD_SWAPS = ("relaunch", "dead", "repair")  # slot changes that fail over; "running" and "stable" only record what runs


def held_while_paused(actions: list[Action], paused: dict | None) -> tuple[list[Action], list[Declare | SwapSlot]]:
    """(the actions to perform, the decisions held). Nothing is held while not paused."""
    if paused is None:
        return actions, []
    keep: list[Action] = []
    held: list[Declare | SwapSlot] = []
    for action in actions:
        if isinstance(action, Declare) or isinstance(action, SwapSlot) and action.kind in HELD_SWAPS:
            held.append(action)
        else:
            keep.append(action)
    return keep, held


def held_record(action: Declare | SwapSlot, paused: dict) -> tuple[tuple, Record]:
    """A held decision's event, and the key that says it once (the same decision again each tick is not news)."""
    if isinstance(action, Declare):
        key = ("declare", action.cohort, action.generation, action.reason)
        fields = {"decision": "declare", "reason": action.reason, "evidence": action.evidence}
        cohort, generation = action.cohort, action.generation
    else:
        slot = action.slot
        key = ("slot", slot.cohort, slot.generation, action.kind)
        fields = {"decision": action.kind, "slot_state": slot.state, "slot_reason": slot.reason}
        cohort, generation = slot.cohort, slot.generation
    fields["paused"] = {k: paused.get(k) for k in ("by", "since", "reason")}
    return key, Record(HELD, cohort, generation, fields)


def describe_pause(record: dict | None) -> str:
    """What automatic failover is, for the status table: ``automatic``, or since when, by whom and why it is paused."""
    if record is None:
        return "automatic"
    since = record.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if isinstance(since, (int, float)) else "?"
    return f"PAUSED since {when} by {record.get('by') or '?'}: {record.get('reason') or '(no reason given)'}"
