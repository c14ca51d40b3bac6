"""The supervisor's steps and their slots: a step is one run of the batch script's ``step_<name>`` (a cohort, an
infra process, a one-off like ``prepare``), a slot the place a relaunchable step runs in, generation after
generation, with its crash-loop count. The count is the node agent's (``relaunch_decision``)."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from ..common.policy import RelaunchDecision, RelaunchPolicy

PARKED, ACTIVE = "standby", "active"  # a cohort leader's failover states: a parked shadow, the serving cohort


@dataclass
class Step:
    name: str  # the script's step name: gms, etcd, cohort_0, ...
    generation: int
    popen: subprocess.Popen
    log_path: str
    started: float = field(default_factory=time.time)
    step_id: str | None = None
    lines: list[str] = field(default_factory=list)
    reached: str | None = None  # the furthest failover state its leader reached: standby or active
    hang: str | None = None  # why the watchdog ended it, if it did
    ended: float | None = None

    @property
    def cohort(self) -> int | None:
        return int(self.name.split("_", 1)[1]) if self.name.startswith("cohort_") else None

    @property
    def ran_s(self) -> float | None:
        """How long it ran, once it ended."""
        return self.ended - self.started if self.ended is not None else None

    def record(self) -> dict[str, Any]:
        return {"generation": self.generation, "step_id": self.step_id, "started": round(self.started, 3),
                "ended": round(self.ended, 3) if self.ended else None, "exit": self.popen.poll(),
                "reached": self.reached, "log": self.log_path}


@dataclass
class StepSlot:
    """One relaunchable step (a cohort or an infra process) and its crash-loop bookkeeping."""
    name: str
    step: Step | None = None
    generation: int = 0
    attempts: int = 0  # quick failures in a row (common/policy.py RelaunchPolicy: the agent's slot count)
    due: float | None = None  # when to relaunch (monotonic clock)
    last_end: float | None = None
    given_up: bool = False
    after_promotion: bool = False  # it was serving: relaunch once a shadow serves (or PROMOTION_WAIT passed)
    history: list[Step] = field(default_factory=list)

    def book(self, decision: RelaunchDecision, now: float) -> None:
        """Take the relaunch decision after its step ended: the new count, and the relaunch due ``now`` (monotonic)
        plus the decision's delay, or the slot given up."""
        self.attempts = decision.attempts
        self.given_up = decision.gives_up
        self.due = None if decision.gives_up else now + decision.delay_s


def relaunch_decision(slot: StepSlot, step: Step, policy: RelaunchPolicy) -> RelaunchDecision:
    """After ``slot``'s ``step`` ended: the node agent's decision (``RelaunchPolicy.after_death``) over the slot's
    count and how long the step ran. Whether its leader parked or served (``step.reached``) does not reset the
    count: a step that parks, or is promoted, and then dies within stable_after_s, again and again, is a crash loop
    on both paths."""
    return policy.after_death(slot.attempts, step.ran_s)
