"""Performs the actions the agent's decisions return (actions.py), in order: systemctl and cgroup kills,
etcd compare-and-swaps, the event log and metrics, the agent's memory. The only place the agent acts.

Each kind of action has one handler, in one of the two tables below: NODE_ACTIONS, what every node does
(node_effects.py), and DRIVER_ACTIONS, what only the driver does (driver_effects.py); the looks the loop never
waits on run in threads (probes.py). Adding an action is its table entry here, plus its duty and test."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..common.etcd_client import Etcd
from ..common.events import EventLog
from ..common.wakeup import drain
from ..deployment.plan import Plan
from .actions import (
    AbandonStart,
    Action,
    AgentBack,
    AgentLost,
    AgentsSeen,
    BeginPromotion,
    CheckStart,
    ClearFence,
    ClearGmsLost,
    Confirm,
    CreateSlot,
    Declare,
    DeferRevocation,
    EndCanary,
    EndPromotion,
    ExtendPromotion,
    Fence,
    FinishTeardown,
    KillRest,
    Launch,
    Launched,
    LaunchFailed,
    LookAtPromotion,
    MarkHealthy,
    NoteDetected,
    NoteFailure,
    NoteFences,
    NoteLaunched,
    NoteLockReplaced,
    NoteMixed,
    NoteProgress,
    ObserveTeardown,
    ProbeLeader,
    ProbePromotion,
    ProbeServing,
    PromotionActive,
    PromotionRegistered,
    PublishRank,
    Record,
    RecordActive,
    RefreshLeases,
    ReleaseBridge,
    ReportFault,
    ReportGmsLost,
    ReportInvalid,
    RevokeRegistration,
    SendCanary,
    SetGeneration,
    SetHolder,
    SetServing,
    SwapSlot,
    TakeBridge,
    TearDown,
    Untrack,
    WakeAt,
)
from .agent_metrics import AgentMetrics
from .driver_effects import DriverEffects
from .failure_notices import FailureNotice, Notifier
from .memory import DriverMemory, NodeMemory
from .node_effects import NodeEffects
from .observe import LeaderProbe, StartCheck
from .pause import held_record, held_while_paused
from .probes import Probes
from .view import DeploymentView

ERROR_REPORT_S = 10.0  # the same error (a tick's, a look's) is written to the event log at most this often


@dataclass
class Schedule:
    """When the loop next shows the node's metrics (sync), next checks health and drives (check), and next
    reconciles the latest view although the feed brought none (reconcile: a full WakeAt), monotonic."""
    next_sync: float = 0.0
    next_check: float = 0.0
    next_reconcile: float = math.inf

    def view_to_reconcile(self, new: DeploymentView | None, latest: DeploymentView | None,
                          now: float) -> DeploymentView | None:
        """The view this tick reconciles: a new one from the feed, else the latest again once a full wake-up is
        due (a delayed launch's not_before, a relayed declaration: decisions of the clock, not of etcd, which
        may bring no news for a while); None: nothing to reconcile. Either way a pending wake-up is spent: the
        reconcile asks for the next one if it still waits."""
        if new is None and (latest is None or now < self.next_reconcile):
            return None
        self.next_reconcile = math.inf
        return new if new is not None else latest


class Executor:
    def __init__(self, plan: Plan, host: str, etcd: Etcd, events: EventLog, metrics: AgentMetrics,  # noqa: PLR0913 (over the size limits of pyproject.toml; split it when it changes next)
                 node: NodeMemory, driver: DriverMemory | None, schedule: Schedule, wake_fd: int,
                 notifier: Notifier | None = None) -> None:
        self.plan = plan
        self.host = host
        self.events = events
        self.metrics = metrics
        self.node = node
        self.driver = driver
        self.schedule = schedule
        self.probes = Probes(plan, wake_fd)  # the looks in threads of their own; their answers come back by queue
        self.node_side = NodeEffects(plan, host, etcd, events, metrics, node, self.probes)
        self.driver_side = DriverEffects(plan, host, etcd, events, metrics, node, self.probes)
        self.view: DeploymentView | None = None  # the agent's latest view: a declaration's compare-and-swap starts there
        self.faults_reported: dict[tuple[str, int | None, str], float] = {}  # ReportFault's last line, by look and error
        self.notifier = notifier  # tells the other nodes' agents of a declaration directly (failure_notices.py)
        self.noticed: set[tuple[int, int]] = set()  # the (cohort, generation)s told already
        self.held: set[tuple] = set()  # decisions held while failover is paused, reported once each (pause.py)

    def __call__(self, actions: list[Action]) -> None:
        actions = self.hold_while_paused(actions)  # before anything of them is told or written
        self.tell([a for a in actions if isinstance(a, Declare)])  # before any etcd write of these actions
        for action in actions:
            self.perform(action)

    def hold_while_paused(self, actions: list[Action]) -> list[Action]:
        """While an operator paused failover (pause.py), declarations and slot changes that fail over are held:
        each reported once (failover-held), none performed."""
        paused = self.view.paused if self.view is not None else None
        if paused is None:
            return actions
        actions, held = held_while_paused(actions, paused)
        for decision in held:
            key, record = held_record(decision, paused)
            if key not in self.held:
                self.held.add(key)
                self.events.write(record.event, record.cohort, record.generation, **record.fields)
        return actions

    def tell(self, declarations: list[Declare]) -> None:
        """Tell the other nodes' agents of every generation these actions declare failed, all before the first
        compare-and-swap (a GPU fault fails every cohort on the GPU at once: a notice per cohort sent only after
        the previous cohort's etcd write let another node kill the serving leader, and free the failover lock,
        milliseconds before the parked shadow of the same faulty GPU, which could take the lock meanwhile)."""
        for action in declarations:
            key = (action.cohort, action.generation)
            if self.notifier is not None and key not in self.noticed:
                self.noticed.add(key)
                self.notifier.send(FailureNotice(self.plan.deployment, action.cohort, action.generation,
                                                 action.reason, self.host, time.time(), action.evidence))

    def report_fault(self, fault: ReportFault) -> None:
        key = (fault.event, fault.cohort, fault.error)
        now = time.monotonic()
        if now - self.faults_reported.get(key, float("-inf")) >= ERROR_REPORT_S:
            self.faults_reported[key] = now
            self.events.write(fault.event, fault.cohort, fault.generation, error=fault.error)

    # One handler per kind of action a node performs, each one call: to the node's effects (node_side:
    # node_effects.py) or the executor's own; an action not here is the driver's (perform_driver). Every kind of
    # action (actions.Action) is in exactly one of the two tables (tests/unit/test_executor_dispatch.py).
    NODE_ACTIONS: ClassVar[dict[type, Callable[[Executor, Any], object]]] = {
        Record: lambda self, a: self.events.write(a.event, a.cohort, a.generation, **a.fields),
        ReportFault: lambda self, a: self.report_fault(a),
        WakeAt: lambda self, a: self.wake_at(a),
        Declare: lambda self, a: self.node_side.declare(a, self.view),
        TearDown: lambda self, a: self.node_side.tear_down(a.rank, a.since, a.grace),
        FinishTeardown: lambda self, a: self.node_side.finish_terminating(a),
        KillRest: lambda self, a: self.node_side.kill_rest(a.cohort),
        Confirm: lambda self, a: self.node_side.confirms.append(a),
        Launch: lambda self, a: self.node_side.launch(a.cohort, a.generation, a.config),
        PublishRank: lambda self, a: self.node_side.publishes.append(a),
        CheckStart: lambda self, a: self.node_side.check_start(a),
        Launched: lambda self, a: self.node_side.launched(a.rank),
        Untrack: lambda self, a: self.node_side.untrack(a),
        LaunchFailed: lambda self, a: self.node_side.launch_failed(a),
        AbandonStart: lambda self, a: self.node_side.abandon_start(a),
        NoteDetected: lambda self, a: self.node.detected_at.setdefault((a.cohort, a.generation), a.when),
        NoteFailure: lambda self, a: self.node_side.know(a.cohort, a.failure),
        MarkHealthy: lambda self, a: self.node_side.mark_healthy(a),
        ProbeLeader: lambda self, a: self.node_side.probe_leader(a),
        NoteProgress: lambda self, a: self.node_side.note_progress(a),
        Fence: lambda self, a: self.node_side.fence(a),
        ClearFence: lambda self, a: self.node_side.fence(a),
        SetGeneration: lambda self, a: self.node_side.set_generation(a),
        ReportInvalid: lambda self, a: self.node_side.report_invalid(a),
        ReportGmsLost: lambda self, a: self.node_side.report_gms_lost(a),
    }

    # One handler per kind of action only the driver performs, each one call, given the driver's memory too: to
    # the driver's effects (driver_side: driver_effects.py), or a note in the driver's memory. A slot's swap
    # hands back what it then asks for, performed here.
    DRIVER_ACTIONS: ClassVar[dict[type, Callable[[Executor, Any, DriverMemory], object]]] = {
        SwapSlot: lambda self, a, driver: self(self.driver_side.swap(a, driver)),
        NoteMixed: lambda self, a, driver: driver.mixed.add((a.cohort, a.generation)),
        RevokeRegistration: lambda self, a, driver: self.driver_side.revoke(a, driver),
        DeferRevocation: lambda self, a, driver: self.driver_side.defer_revocation(a, driver),
        ObserveTeardown: lambda self, a, driver: self.metrics.observe("teardown_seconds", a.seconds),
        NoteLaunched: lambda self, a, driver: driver.launched_at.setdefault((a.cohort, a.generation), a.when),
        SetServing: lambda self, a, driver: self.driver_side.set_serving(a, driver),
        CreateSlot: lambda self, a, driver: self.driver_side.create_slot(a, driver),
        SetHolder: lambda self, a, driver: self.driver_side.set_holder(a, driver),
        BeginPromotion: lambda self, a, driver: self.driver_side.begin_promotion(a, driver),
        TakeBridge: lambda self, a, driver: self.driver_side.take_bridge(a, driver),
        ReleaseBridge: lambda self, a, driver: self.driver_side.release_bridge(driver),
        NoteLockReplaced: lambda self, a, driver: self.driver_side.note_lock_replaced(a, driver),
        ExtendPromotion: lambda self, a, driver: self.driver_side.extend_promotion(a, driver),
        PromotionActive: lambda self, a, driver: self.driver_side.promotion_active(a, driver),
        PromotionRegistered: lambda self, a, driver: self.driver_side.promotion_registered(a, driver),
        ProbePromotion: lambda self, a, driver: self.driver_side.probe_promotion(driver),
        LookAtPromotion: lambda self, a, driver: self.driver_side.look_at_promotion(driver),
        EndPromotion: lambda self, a, driver: self.driver_side.end_promotion(a, driver),
        RecordActive: lambda self, a, driver: self.driver_side.record_active(a),
        AgentsSeen: lambda self, a, driver: self.driver_side.note_agents_seen(a, driver),
        AgentLost: lambda self, a, driver: self.driver_side.agent_lost(a, driver),
        AgentBack: lambda self, a, driver: driver.agents_lost.pop(a.node, None),
        ProbeServing: lambda self, a, driver: self.driver_side.probe_serving(a, driver),
        SendCanary: lambda self, a, driver: self.driver_side.send_canary(a, driver),
        EndCanary: lambda self, a, driver: self.driver_side.end_canary(driver),
        NoteFences: lambda self, a, driver: self.driver_side.note_fences(a, driver),
        RefreshLeases: lambda self, a, driver: self.driver_side.refresh_leases(a.outage_s),
        ClearGmsLost: lambda self, a, driver: self.driver_side.clear_gms_lost(a),
    }

    def perform(self, action: Action) -> None:
        """Perform one action: by its handler in NODE_ACTIONS, else as the driver's (perform_driver)."""
        handler = self.NODE_ACTIONS.get(type(action))
        if handler is None:
            self.perform_driver(action)
        else:
            handler(self, action)

    def wake_at(self, action: WakeAt) -> None:
        if action.full:
            self.schedule.next_reconcile = min(self.schedule.next_reconcile, action.mono)
        else:
            self.schedule.next_check = min(self.schedule.next_check, action.mono)

    def perform_driver(self, action: Action) -> None:
        """Perform one of the driver's actions by its handler in DRIVER_ACTIONS, with the driver's memory."""
        handler = self.DRIVER_ACTIONS.get(type(action))
        if handler is None:
            elsewhere = ("it is a node's action (Executor.perform)" if type(action) in self.NODE_ACTIONS
                         else "nor in Executor.NODE_ACTIONS")
            raise TypeError(f"no executor for {action!r}: {type(action).__name__} is not in "
                            f"Executor.DRIVER_ACTIONS, {elsewhere}")
        driver = self.driver
        if driver is None:
            raise AssertionError(f"{type(action).__name__} is a driver's action; this agent is no driver")
        handler(self, action, driver)

    def flush(self) -> None:
        """The tick's confirmations, rank records and settled units, written last (NodeEffects.flush)."""
        self.node_side.flush()

    # --- the threads' answers, handed over once a tick -----------------------------------------------------------
    def take_leader_probes(self) -> list[LeaderProbe]:
        """The leader probes answered since the last tick."""
        return drain(self.probes.leader_probes)

    def take_start_checks(self) -> list[StartCheck]:
        """The looks at starts answered since the last tick."""
        return drain(self.probes.start_checks)

    def take_probe_results(self) -> bool:
        """Hand the probes' and looks' answers to the driver's memory; True when one about the promotion came."""
        answered = False
        for cohort, generation, seen in drain(self.probes.promotion_looks):
            if seen.error:  # reported like the other looks' errors; the promotion is looked at again
                self.report_fault(ReportFault("promotion-look-error", cohort, generation, seen.error))
            p = self.driver.promotion if self.driver is not None else None
            if p is not None and (p.cohort, p.generation) == (cohort, generation):
                p.seen, p.looking = seen, False
                answered = True
        for result in drain(self.probes.completions):
            driver = self.driver
            if driver is None:
                continue
            if result.kind == "serving":
                driver.serving_probe = result.request
                if result.request.ok:
                    driver.serving_ok_at = max(driver.serving_ok_at, result.request.end_mono)
                continue
            if result.kind == "canary":
                canary = driver.canary
                if canary is not None and (canary.cohort, canary.generation) == (result.cohort, result.generation):
                    canary.answer = result.request
                continue
            p = driver.promotion
            if p is not None and (p.cohort, p.generation) == (result.cohort, result.generation):
                p.completion = result.request
                p.probing = False
                answered = True
        return answered
