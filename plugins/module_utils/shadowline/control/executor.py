"""Performs the actions the agent's decisions return (actions.py), in order: systemctl and cgroup kills,
etcd compare-and-swaps, the event log and metrics, the agent's memory. The only place the agent acts."""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from ..cluster.access import frontend_context
from ..cluster.discovery import registrations, revoke_leases, worker_registrations
from ..common import frontend
from ..common.coordination import Coordination, RankRecord
from ..common.etcd_client import Etcd, EtcdError
from ..common.events import EventLog
from ..common.lock import try_acquire
from ..common.proc import alive, kill_cgroup, systemctl
from ..common.wakeup import drain, wake
from ..deployment.plan import Plan
from . import observe
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
from .failure_notices import FailureNotice, Notifier
from .memory import Canary, DriverMemory, KnownFailure, LocalRank, NodeMemory, PromotionSeen, Start, Teardown
from .node_duties import start_refusal
from .observe import LeaderProbe, StartCheck, rank_alive
from .pause import held_record, held_while_paused
from .view import DeploymentView, Now

KILL_AGAIN_S = 0.2  # a cgroup not empty after SIGKILL: killed again this often (forks, a wait that ends)
NOT_GONE_REPORT_S = 1.0  # a killed rank's cgroup still not empty this long after the teardown began: say so
ERROR_REPORT_S = 10.0  # the same error (a tick's, a look's) is written to the event log at most this often
LAUNCH_ASK_S = 10.0  # an abandoned start waits at most this long for its start job to be asked (systemctl's own timeout)


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


@dataclass(frozen=True)
class ProbeResult:
    """A frontend completion sent from a probe thread, handed back to the loop (threads write nothing else)."""
    kind: str  # "promotion", "serving" or "canary"
    request: frontend.Request
    cohort: int | None = None
    generation: int | None = None


T = TypeVar("T")


class Executor:
    def __init__(self, plan: Plan, host: str, etcd: Etcd, events: EventLog, metrics: AgentMetrics,  # noqa: PLR0913 (over the size limits of pyproject.toml; split it when it changes next)
                 node: NodeMemory, driver: DriverMemory | None, schedule: Schedule, wake_fd: int,
                 notifier: Notifier | None = None) -> None:
        self.plan = plan
        self.host = host
        self.etcd = etcd
        self.coord = Coordination(etcd, plan.deployment)
        self.events = events
        self.metrics = metrics
        self.node = node
        self.driver = driver
        self.schedule = schedule
        self.wake_fd = wake_fd
        self.probes: queue.Queue[ProbeResult] = queue.Queue()
        self.leader_probes: queue.Queue[LeaderProbe] = queue.Queue()
        self.start_checks: queue.Queue[StartCheck] = queue.Queue()
        self.promotion_looks: queue.Queue[tuple[int, int, PromotionSeen]] = queue.Queue()
        self.confirms: list[Confirm] = []  # written to etcd after the tick's kills and declarations
        self.publishes: list[PublishRank] = []  # this node's rank records, written after the confirmations
        self.settles: list[str] = []  # units whose processes are gone, stopped in systemd after the confirmations
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

    # One handler per kind of action a node performs, each an executor method or one call; an action not here is
    # the driver's (perform_driver). Every kind of action (actions.Action) is in exactly one of the two tables
    # (tests/unit/test_executor_dispatch.py).
    NODE_ACTIONS: ClassVar[dict[type, Callable[[Executor, Any], object]]] = {
        Record: lambda self, a: self.events.write(a.event, a.cohort, a.generation, **a.fields),
        ReportFault: lambda self, a: self.report_fault(a),
        WakeAt: lambda self, a: self.wake_at(a),
        Declare: lambda self, a: self.declare(a),
        TearDown: lambda self, a: self.tear_down(a.rank, a.since, a.grace),
        FinishTeardown: lambda self, a: self.finish_terminating(a),
        KillRest: lambda self, a: self.kill_rest(a.cohort),
        Confirm: lambda self, a: self.confirms.append(a),
        Launch: lambda self, a: self.launch(a.cohort, a.generation, a.config),
        PublishRank: lambda self, a: self.publishes.append(a),
        CheckStart: lambda self, a: self.check_start(a),
        Launched: lambda self, a: self.launched(a.rank),
        Untrack: lambda self, a: self.untrack(a),
        LaunchFailed: lambda self, a: self.launch_failed(a),
        AbandonStart: lambda self, a: self.abandon_start(a),
        NoteDetected: lambda self, a: self.node.detected_at.setdefault((a.cohort, a.generation), a.when),
        NoteFailure: lambda self, a: self.know(a.cohort, a.failure),
        MarkHealthy: lambda self, a: self.mark_healthy(a),
        ProbeLeader: lambda self, a: self.probe_leader(a),
        NoteProgress: lambda self, a: self.note_progress(a),
        Fence: lambda self, a: self.fence(a),
        ClearFence: lambda self, a: self.fence(a),
        SetGeneration: lambda self, a: self.set_generation(a),
        ReportInvalid: lambda self, a: self.report_invalid(a),
        ReportGmsLost: lambda self, a: self.report_gms_lost(a),
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

    def finish_terminating(self, action: FinishTeardown) -> None:
        """A terminating rank's cgroup is empty: its teardown is finished (if it is still terminating)."""
        teardown = self.node.terminating.pop(action.cohort, None)
        if teardown is not None:
            self.finish_teardown(teardown.rank, teardown.since)

    def untrack(self, action: Untrack) -> None:
        if action.rank.pidfd is not None:
            os.close(action.rank.pidfd)

    def launch_failed(self, action: LaunchFailed) -> None:
        self.node.starting.pop(action.cohort, None)
        status = systemctl("status", "--no-pager", "-n", "5", self.plan.unit_name("engine", action.cohort))
        self.events.write("launch-failed", action.cohort, action.generation, failure=action.failure,
                          status=status.stdout.strip()[-400:])

    def abandon_start(self, action: AbandonStart) -> None:
        start = self.node.starting.pop(action.cohort, None)
        if start is not None and start.requested is not None:
            start.requested.wait(LAUNCH_ASK_S)  # the stop comes after the start job, never before it
        systemctl("stop", self.plan.unit_name("engine", action.cohort))
        self.events.write("launch-abandoned", action.cohort, action.generation,
                          slot_generation=action.slot_generation, slot_state=action.slot_state)

    def mark_healthy(self, action: MarkHealthy) -> None:
        rank = self.node.ranks.get(action.cohort)
        if rank is not None:
            rank.healthy_at = action.at

    def note_progress(self, action: NoteProgress) -> None:
        rank = self.node.ranks.get(action.cohort)
        if rank is not None:
            rank.progress, rank.progress_at = action.observation, action.at

    def set_generation(self, action: SetGeneration) -> None:
        rank = self.node.ranks.get(action.cohort)
        if rank is not None:
            rank.generation = action.generation
            self.events.write("rank-adopted", action.cohort, action.generation, pid=rank.pid)

    def report_invalid(self, action: ReportInvalid) -> None:
        self.node.reported_invalid.add((action.key, action.revision))
        self.metrics.count("records_invalid_total")
        self.events.write("record-invalid", key=action.key, revision=action.revision, why=action.why,
                          detail="written by a newer shadowline: upgrade this agent" if action.newer
                          else "ignored: the agent acts on nothing in it")

    def report_gms_lost(self, action: ReportGmsLost) -> None:
        try:
            self.etcd.put(self.coord.keys.gms_lost(self.host), json.dumps({"time": action.when}))
        except EtcdError as err:
            self.events.write("gms-lost-unreported", error=str(err))

    # --- a node's ranks ----------------------------------------------------------------------------------------
    def know(self, cohort: int, failure: KnownFailure) -> None:
        """Remember a generation's failure; the first known of a generation stays (its first cause)."""
        known = self.node.known_failures.get(cohort)
        if known is None or known.generation != failure.generation:
            self.node.known_failures[cohort] = failure

    def declare(self, action: Declare) -> None:
        key = (action.cohort, action.generation)  # told to the other agents already (tell)
        self.know(action.cohort, KnownFailure(action.generation, action.reason, action.evidence, None,
                                              time.monotonic()))
        if self.node.etcd_lost_since is not None:  # no etcd: the next view after it returns shows what to declare
            if key not in self.node.declare_errors:
                self.node.declare_errors.add(key)
                self.events.write("declare-deferred", action.cohort, action.generation, reason=action.reason,
                                  detail="etcd does not answer; declared from the first view after it returns")
            return
        try:
            entry = self.view.slots.get(action.cohort) if self.view is not None else None
            known = (entry.slot, entry.revision) if entry is not None else None
            slot = self.coord.declare_failed(action.cohort, action.generation, action.reason, self.host, known)
        except EtcdError as err:
            if key not in self.node.declare_errors:
                self.node.declare_errors.add(key)
                self.events.write("declare-failed-error", action.cohort, action.generation, reason=action.reason,
                                  error=str(err))
            return
        if slot is not None:
            self.node.detected_at[key] = slot.since
            self.metrics.count("detections_total", action.reason)
            self.events.write("failure-declared", action.cohort, action.generation, reason=action.reason,
                              **action.evidence)

    def fence(self, action: Fence | ClearFence) -> None:
        if isinstance(action, ClearFence):
            self.node.fence, self.node.fence_written = None, False
            return
        self.node.fence, self.node.fence_written = action.record, False
        try:
            self.etcd.put(self.coord.keys.fenced(action.host), json.dumps(action.record, sort_keys=True))
        except EtcdError as err:
            self.events.write("fence-deferred", error=str(err))  # written again from the next view
            return
        self.node.fence_written = True

    def tear_down(self, rank: LocalRank, since: float, grace: float) -> None:
        """Kill every process of the rank (its unit's cgroup) without waiting for etcd. With a grace (a planned
        failover), SIGTERM now and SIGKILL whatever is left when it ends. Confirmed gone only once the cgroup is
        empty: what outlives SIGKILL (an uninterruptible wait) keeps the teardown open, killed again each pass.

        Nothing here waits for the processes to end: a tick's declaration, which every other node's teardown
        waits for, comes right after the signal. The kernel may take a while to end what SIGKILL hit (a process with
        GPU memory to release, or in an uninterruptible wait); the kernel wakes the loop as the unit's cgroup
        empties (its cgroup.events: agent.watch_teardowns), which confirms the rank gone (teardowns_due)."""
        self.node.ranks.pop(rank.cohort, None)
        now = Now.read().mono
        if grace > 0 and rank.cgroup:
            kill_cgroup(rank.cgroup, signal.SIGTERM)
            self.node.terminating[rank.cohort] = Teardown(rank=rank, since=since, kill_at=now + grace)
            self.events.write("ranks-terminating", rank.cohort, rank.generation, grace_s=grace)
            return
        if self.kill(rank):
            self.finish_teardown(rank, since)
            return
        self.node.terminating[rank.cohort] = Teardown(rank=rank, since=since, kill_at=now + KILL_AGAIN_S,
                                                      killed=True)

    def kill(self, rank: LocalRank) -> bool:
        """SIGKILL the rank, without waiting; True when nothing of it is left already."""
        if not rank.cgroup:
            if alive(rank.pid):
                os.kill(rank.pid, signal.SIGKILL)
        else:
            kill_cgroup(rank.cgroup, signal.SIGKILL)
        return not rank_alive(rank)

    def kill_rest(self, cohort: int) -> None:
        teardown = self.node.terminating.get(cohort)
        if teardown is None:
            return
        rank = teardown.rank
        if self.kill(rank):
            self.node.terminating.pop(cohort, None)
            self.finish_teardown(rank, teardown.since)
            return
        now = Now.read()
        teardown.killed = True
        teardown.kill_at = now.mono + KILL_AGAIN_S
        if not teardown.reported and now.wall - teardown.since > NOT_GONE_REPORT_S:
            teardown.reported = True
            self.events.write("ranks-not-gone", rank.cohort, rank.generation,
                              seconds=round(now.wall - teardown.since, 3),
                              detail="processes outlived SIGKILL (uninterruptible wait?); not confirmed gone "
                                     "until the cgroup is empty")

    def finish_teardown(self, rank: LocalRank, since: float) -> None:
        """Nothing of the rank runs any more: confirm and settle the unit, both after this tick's declarations."""
        done = Now.read().wall
        if rank.pidfd is not None:
            os.close(rank.pidfd)
            rank.pidfd = None
        self.confirms.append(Confirm(rank.cohort, rank.generation, done))
        self.settles.append(rank.unit)
        self.metrics.count("teardowns_total")
        self.events.write("ranks-gone", rank.cohort, rank.generation, when=done, seconds=round(done - since, 4))

    def flush(self) -> None:
        """The tick's confirmations, written once its kills and declarations are done; then its torn-down units
        stopped in systemd (their processes are gone already). Not before: ``systemctl stop --no-block`` took
        6.9 ms (median; 10.4 ms at most) on a testbed host, which the declaration of a dead rank used to wait for
        (the other nodes' teardowns wait for the declaration)."""
        confirms, self.confirms = self.confirms, []
        for action in confirms:
            self.confirm(action.cohort, action.generation, action.when)
        publishes, self.publishes = self.publishes, []
        for publish in publishes:
            self.publish(publish)
        settles, self.settles = self.settles, []
        for unit in settles:
            systemctl("stop", "--no-block", unit)

    def publish(self, action: PublishRank) -> None:
        """This node's record of its rank (node_duties.publish_due); written again from a later view if it fails."""
        if self.node.etcd_lost_since is not None:
            return
        record = RankRecord(action.generation, action.config, action.pid, self.node.instance)
        try:
            self.etcd.put(self.coord.keys.rank(action.cohort, self.host), record.to_json())
            self.node.published[action.cohort] = (action.generation, action.config)
        except EtcdError as err:
            self.events.write("rank-record-error", action.cohort, action.generation, error=str(err))

    def confirm(self, cohort: int, generation: int, when: float) -> None:
        if (cohort, generation) in self.node.confirmed or not generation:
            return
        if self.node.etcd_lost_since is not None:
            return  # the slot, once etcd answers again, asks for it (node_duties.settle_failed)
        try:
            self.coord.confirm_gone(cohort, generation, self.host, when)
            self.node.confirmed.add((cohort, generation))
        except EtcdError as err:
            self.events.write("confirm-error", cohort, generation, error=str(err))

    def launch(self, cohort: int, generation: int, config: str = "") -> None:
        """Start this node's rank of a new generation without waiting for it: systemd is asked for the start job
        in a thread (its two systemctl calls took 31-180 ms on a loaded testbed host, and the loop would wait for
        them: the driver's promotion, every detection and teardown on this node), and the loop tracks the start
        once the job was asked for (until then the unit still shows the failed generation). The unit files'
        configuration is read first when the slot names one: another one is not started (Start.refused, judged
        by node_duties.start_progress)."""
        unit = self.plan.unit_name("engine", cohort)
        requested = threading.Event()
        start = self.node.starting[cohort] = Start(generation, Now.read().mono, requested)

        def ask() -> None:
            try:
                start.refused = start_refusal(config, observe.installed_config_of(self.plan, cohort)) if config else ""
                if start.refused:
                    return
                systemctl("reset-failed", unit)
                systemctl("start", "--no-block", unit)
            finally:  # a systemctl that failed or hung: the start is judged from the unit's state as ever
                requested.set()
                wake(self.wake_fd, b"l")
        threading.Thread(target=ask, name=f"launch-{cohort}", daemon=True).start()

    def check_start(self, action: CheckStart) -> None:
        """A start's unit looked at in a thread of its own (observe.check_start: one or two ``systemctl show``,
        9-55 ms each on a loaded testbed host, every tick of a start); the answer wakes the loop."""
        self.node.checking[action.cohort] = action.generation  # one out per start: judge_starts clears it
        self.answer_in_thread(f"start-check-{action.cohort}", self.start_checks, lambda: observe.check_start(
            self.plan, self.host, action.cohort, action.generation), b"s")

    def take_start_checks(self) -> list[StartCheck]:
        """The looks at starts answered since the last tick."""
        return drain(self.start_checks)

    def launched(self, rank: LocalRank) -> None:
        self.node.starting.pop(rank.cohort, None)
        self.node.ranks[rank.cohort] = rank
        if rank.cgroup:
            self.node.unit_cgroups[rank.cohort] = rank.cgroup
        self.metrics.count("relaunches_total")
        detected = self.node.detected_at.get((rank.cohort, rank.generation - 1))
        if detected:
            self.metrics.observe("relaunch_seconds", Now.read().wall - detected)
        self.events.write("rank-launched", rank.cohort, rank.generation, pid=rank.pid)

    # --- the driver ----------------------------------------------------------------------------------------------
    # One handler per kind of action only the driver performs, each an executor method or one call, given the
    # driver's memory too.
    DRIVER_ACTIONS: ClassVar[dict[type, Callable[[Executor, Any, DriverMemory], object]]] = {
        SwapSlot: lambda self, a, driver: self.swap(a, driver),
        NoteMixed: lambda self, a, driver: driver.mixed.add((a.cohort, a.generation)),
        RevokeRegistration: lambda self, a, driver: self.revoke(a, driver),
        DeferRevocation: lambda self, a, driver: self.defer_revocation(a, driver),
        ObserveTeardown: lambda self, a, driver: self.metrics.observe("teardown_seconds", a.seconds),
        NoteLaunched: lambda self, a, driver: driver.launched_at.setdefault((a.cohort, a.generation), a.when),
        SetServing: lambda self, a, driver: self.set_serving(a, driver),
        CreateSlot: lambda self, a, driver: self.create_slot(a, driver),
        SetHolder: lambda self, a, driver: self.set_holder(a, driver),
        BeginPromotion: lambda self, a, driver: self.begin_promotion(a, driver),
        TakeBridge: lambda self, a, driver: self.take_bridge(a, driver),
        ReleaseBridge: lambda self, a, driver: self.release_bridge(driver),
        NoteLockReplaced: lambda self, a, driver: self.note_lock_replaced(a, driver),
        ExtendPromotion: lambda self, a, driver: self.extend_promotion(a, driver),
        PromotionActive: lambda self, a, driver: self.promotion_active(a, driver),
        PromotionRegistered: lambda self, a, driver: self.promotion_registered(a, driver),
        ProbePromotion: lambda self, a, driver: self.probe_promotion(driver),
        LookAtPromotion: lambda self, a, driver: self.look_at_promotion(driver),
        EndPromotion: lambda self, a, driver: self.end_promotion(a, driver),
        RecordActive: lambda self, a, driver: self.record_active(a),
        AgentsSeen: lambda self, a, driver: self.note_agents_seen(a, driver),
        AgentLost: lambda self, a, driver: self.agent_lost(a, driver),
        AgentBack: lambda self, a, driver: driver.agents_lost.pop(a.node, None),
        ProbeServing: lambda self, a, driver: self.probe_serving(a, driver),
        SendCanary: lambda self, a, driver: self.send_canary(a, driver),
        EndCanary: lambda self, a, driver: self.end_canary(driver),
        NoteFences: lambda self, a, driver: self.note_fences(a, driver),
        RefreshLeases: lambda self, a, driver: self.refresh_leases(a.outage_s),
        ClearGmsLost: lambda self, a, driver: self.clear_gms_lost(a),
    }

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

    def defer_revocation(self, action: DeferRevocation, driver: DriverMemory) -> None:
        driver.unrevoked[(action.cohort, action.generation)] = action.since

    def set_serving(self, action: SetServing, driver: DriverMemory) -> None:
        driver.adopted = True
        if driver.serving is None:
            driver.serving = action.cohort

    def create_slot(self, action: CreateSlot, driver: DriverMemory) -> None:
        try:
            if self.coord.create_slot(action.slot):
                self.events.write("slot-created", action.slot.cohort, action.slot.generation,
                                  state=action.slot.state)
        except EtcdError:
            driver.adopted = False  # the next view tries again

    def set_holder(self, action: SetHolder, driver: DriverMemory) -> None:
        if driver.holder is not None:
            driver.last_holder = driver.holder
        driver.holder = action.holder

    def begin_promotion(self, action: BeginPromotion, driver: DriverMemory) -> None:
        driver.promotion = action.promotion

    def take_bridge(self, action: TakeBridge, driver: DriverMemory) -> None:
        driver.bridge = try_acquire(self.plan.lock_path, action.engine_id)
        if driver.bridge is not None:  # the engines' user must open it, as the file it replaces
            directory = os.stat(os.path.dirname(self.plan.lock_path))
            os.fchown(driver.bridge.fd, directory.st_uid, directory.st_gid)
            self.events.write("lock-bridged", detail=f"the driver holds {self.plan.lock_path} for engine-"
                                                     f"{action.engine_id} until that engine lets its lock go")

    def release_bridge(self, driver: DriverMemory) -> None:
        if driver.bridge is not None:
            driver.bridge.release()
        driver.bridge = None
        driver.lock_replaced_at = None

    def note_lock_replaced(self, action: NoteLockReplaced, driver: DriverMemory) -> None:
        driver.lock_replaced_at = action.when

    def extend_promotion(self, action: ExtendPromotion, driver: DriverMemory) -> None:
        if driver.promotion is not None:
            driver.promotion.wake_deadline += action.seconds
            driver.promotion.deadline += action.seconds

    def promotion_active(self, action: PromotionActive, driver: DriverMemory) -> None:
        if driver.promotion is not None:
            driver.promotion.active_at = action.at

    def promotion_registered(self, action: PromotionRegistered, driver: DriverMemory) -> None:
        p = driver.promotion
        if p is not None:
            p.leases, p.registered_at = list(action.leases), action.at
            driver.registered[(p.cohort, p.generation)] = list(action.leases)

    def probe_promotion(self, driver: DriverMemory) -> None:
        p = driver.promotion
        if p is not None:
            p.probing = True
            self.probe("promotion", p.cohort, p.generation)

    def end_promotion(self, action: EndPromotion, driver: DriverMemory) -> None:
        if action.promoted and driver.promotion is not None:
            driver.serving = driver.promotion.cohort
        driver.promotion = None
        if action.count:
            self.metrics.count(action.count)

    def record_active(self, action: RecordActive) -> None:
        try:
            self.coord.record_active(action.cohort, action.generation)
        except EtcdError as err:
            self.events.write("record-active-error", action.cohort, action.generation, error=str(err))
        if action.promote_s is not None:
            self.metrics.observe("promotion_seconds", action.promote_s)

    def note_agents_seen(self, action: AgentsSeen, driver: DriverMemory) -> None:
        driver.agents_seen |= action.nodes

    def agent_lost(self, action: AgentLost, driver: DriverMemory) -> None:
        driver.agents_lost[action.node] = action.at
        driver.serving_ok_at = action.at
        self.metrics.count("agents_lost_total")

    def probe_serving(self, action: ProbeServing, driver: DriverMemory) -> None:
        driver.next_serving_probe = action.next_at
        self.probe("serving")

    def end_canary(self, driver: DriverMemory) -> None:
        driver.canary = None

    def note_fences(self, action: NoteFences, driver: DriverMemory) -> None:
        driver.fences_reported = set(action.nodes)

    def clear_gms_lost(self, action: ClearGmsLost) -> None:
        for key in action.keys:
            try:
                self.etcd.delete(key)
            except EtcdError:
                pass  # seen again next pass: the republish decision is idempotent

    def refresh_leases(self, outage_s: float) -> None:
        """Renew every discovery lease once; a lease that is gone, or etcd away again, is left to its owner."""
        renewed = []
        try:
            for registration in registrations(self.etcd):
                if self.etcd.lease_keepalive(registration.lease) > 0:
                    renewed.append(f"{registration.lease:x}")
        except EtcdError as err:
            self.events.write("leases-refresh-error", error=str(err))
        self.events.write("leases-refreshed", outage_s=round(outage_s, 3), leases=renewed)

    def send_canary(self, action: SendCanary, driver: DriverMemory) -> None:
        driver.next_canary = action.next_at
        driver.canary = Canary(action.cohort, action.generation, action.sent_at, action.tokens)
        # the request may take longer than the canary's judgement: the driver decides at progress_stall_s
        self.probe("canary", action.cohort, action.generation, timeout=2 * self.plan.failover.progress_stall_s + 1)

    def swap(self, action: SwapSlot, driver: DriverMemory) -> None:
        try:
            swapped = self.coord.swap(action.slot, action.revision)
        except EtcdError:
            return
        if not swapped:
            return
        slot = action.slot
        if action.kind == "dead":
            self.metrics.count("slots_dead_total")
        elif action.kind == "relaunch":
            if action.detected is not None:
                self.node.detected_at[(slot.cohort, slot.generation - 1)] = action.detected
            if action.launch_at is not None:  # a launch can fail before the next pass
                driver.launched_at[(slot.cohort, slot.generation)] = action.launch_at
        self(list(action.then))

    def revoke(self, action: RevokeRegistration, driver: DriverMemory) -> None:
        failed = (action.cohort, action.generation)
        recorded = driver.registered.get(failed, [])
        others = {lease for key, held in driver.registered.items() if key != failed and key[0] == action.cohort
                  for lease in held}
        try:  # a later generation of the cohort may be registered by now: its leases are not the failed one's
            found = [lease for lease in self.registrations(action.cohort) if lease not in others]
            leases = list(dict.fromkeys([*recorded, *found]))
            revoked = revoke_leases(self.etcd, leases) if leases else []
        except EtcdError as err:
            # tried again (revoke_due, at most every REVOKE_RETRY_S while etcd answers): a dead registration
            # left would keep the frontend routing requests to it for its lease's 30 s
            driver.unrevoked.setdefault(failed, time.time())
            driver.revoke_failed_at[failed] = time.time()
            self.events.write("revoke-error", action.cohort, action.generation, error=str(err))
            return
        driver.revoked.add(failed)
        driver.unrevoked.pop(failed, None)
        driver.revoke_failed_at.pop(failed, None)
        driver.registered.pop(failed, None)
        if revoked:
            self.events.write("registration-revoked", action.cohort, action.generation,
                              leases=[f"{lease:x}" for lease in revoked])

    def registrations(self, cohort: int, ports: set[int] | None = None) -> list[int]:
        """The discovery leases of ``cohort``'s leader (see discovery.cohort_registrations)."""
        c = self.plan.cohort(cohort)
        return [r.lease for r in worker_registrations(self.etcd, c.leader.address, c.ports.system, ports or (),
                                                      self.plan.model_id)]

    def look_at_promotion(self, driver: DriverMemory) -> None:
        """The promoted cohort looked at in a thread of its own (an HTTP read of its leader's metrics, then an etcd
        read of discovery, every 50 ms while it is verified: in the loop they held up the driver node's own
        teardown of the failed cohort); the answer wakes the loop."""
        p = driver.promotion
        if p is None:
            return
        p.looking, p.look_sent = True, time.monotonic()
        rank = self.node.ranks.get(p.cohort)
        cohort, generation, want_state = p.cohort, p.generation, p.active_at is None
        cgroup = rank.cgroup if rank is not None else None
        self.answer_in_thread(f"promotion-look-{cohort}", self.promotion_looks, lambda: (
            cohort, generation, observe.look_at_promotion(self.plan, cohort, want_state, cgroup, self.registrations)),
            b"v")

    # --- probes: threads that only send, their answers come back through the queue ------------------------------
    def answer_in_thread(self, name: str, answers: queue.Queue[T], read: Callable[[], T], why: bytes) -> None:
        """``read()`` in a thread of its own, its answer put in ``answers`` and the loop woken: the loop never
        waits on systemd, an engine, etcd or the frontend. ``read`` must always answer (an answer that never comes
        leaves its start, rank or promotion unjudged for good)."""
        def run() -> None:
            answers.put(read())
            wake(self.wake_fd, why)
        threading.Thread(target=run, name=name, daemon=True).start()

    def probe(self, kind: str, cohort: int | None = None, generation: int | None = None,
              timeout: float = 2.0) -> None:
        def send() -> ProbeResult:
            try:
                request = self.probe_answer(kind, timeout)
            except Exception as err:  # noqa: BLE001 (a probe that died unheard would read as silence: a hang)
                now = time.time()
                request = frontend.Request(0, now, now, 0, False, f"the probe failed: {type(err).__name__}: {err}")
            return ProbeResult(kind, request, cohort, generation)
        self.answer_in_thread(f"{kind}-probe", self.probes, send, b"p")

    def probe_answer(self, kind: str, timeout: float) -> frontend.Request:
        """One probe's completion through the frontend (in a probe thread)."""
        url, now = self.plan.infra.frontend_url, time.time()
        try:  # read at every probe: a rotated certificate counts at once
            context = frontend_context(self.plan)
        except (OSError, ssl.SSLError) as err:
            return frontend.Request(0, now, now, 0, False, f"the frontend's TLS files: {err}")
        if kind == "canary":
            # a canary's silence is a verdict on the engine only when the frontend itself answers (its /live within
            # a third of the time the driver gives the canary); else it is an error, recorded
            silent = frontend.unanswering(url, self.plan.failover.progress_stall_s / 3, context)
            if silent:
                return frontend.Request(0, now, time.time(), 0, False, silent)
        return frontend.probe(url, self.plan.model_id, timeout, context)

    def probe_leader(self, action: ProbeLeader) -> None:
        """A leader's /health (and progress metrics) read in a thread of its own: the loop never waits on an
        engine, so a slow or hung leader delays no teardown, declaration or promotion; the answer wakes it."""
        self.node.probing[action.cohort] = action.generation  # one out per rank: judge_probes clears it
        self.answer_in_thread(f"leader-probe-{action.cohort}", self.leader_probes, lambda: observe.probe_leader(
            self.plan, action.cohort, action.generation, action.timeout, action.progress_timeout), b"h")

    def take_leader_probes(self) -> list[LeaderProbe]:
        """The leader probes answered since the last tick."""
        return drain(self.leader_probes)

    def take_probe_results(self) -> bool:
        """Hand the probes' and looks' answers to the driver's memory; True when one about the promotion came."""
        answered = False
        for cohort, generation, seen in drain(self.promotion_looks):
            if seen.error:  # reported like the other looks' errors; the promotion is looked at again
                self.report_fault(ReportFault("promotion-look-error", cohort, generation, seen.error))
            p = self.driver.promotion if self.driver is not None else None
            if p is not None and (p.cohort, p.generation) == (cohort, generation):
                p.seen, p.looking = seen, False
                answered = True
        for result in drain(self.probes):
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
