"""What the executor does on this node (control/executor.py's NODE_ACTIONS): its ranks launched, looked at, torn
down and settled in systemd, its records in etcd (declarations, confirmations, the rank records, the fence, a
lost GMS server) and the node's memory (NodeMemory). Every node does these, the driver's node too."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from ..common.coordination import Coordination, RankRecord
from ..common.etcd_client import Etcd, EtcdError
from ..common.events import EventLog
from ..common.proc import alive, kill_cgroup, systemctl
from ..common.wakeup import wake
from ..deployment.plan import Plan
from . import observe
from .actions import (
    AbandonStart,
    CheckStart,
    ClearFence,
    Confirm,
    Declare,
    Fence,
    FinishTeardown,
    LaunchFailed,
    MarkHealthy,
    NoteProgress,
    ProbeLeader,
    PublishRank,
    ReportGmsLost,
    ReportInvalid,
    SetGeneration,
    Untrack,
)
from .agent_metrics import AgentMetrics
from .memory import KnownFailure, LocalRank, NodeMemory, Start, Teardown
from .node_duties import start_refusal
from .observe import rank_alive
from .probes import Probes
from .view import DeploymentView, Now

KILL_AGAIN_S = 0.2  # a cgroup not empty after SIGKILL: killed again this often (forks, a wait that ends)
NOT_GONE_REPORT_S = 1.0  # a killed rank's cgroup still not empty this long after the teardown began: say so
LAUNCH_ASK_S = 10.0  # an abandoned start waits at most this long for its start job to be asked (systemctl's own timeout)


class NodeEffects:
    def __init__(self, plan: Plan, host: str, etcd: Etcd, events: EventLog, metrics: AgentMetrics,
                 node: NodeMemory, probes: Probes) -> None:
        self.plan = plan
        self.host = host
        self.etcd = etcd
        self.coord = Coordination(etcd, plan.deployment, plan.replica_of(host).id)
        self.events = events
        self.metrics = metrics
        self.node = node
        self.probes = probes  # the threads of the looks at starts and leaders, and the loop's wake-up pipe
        self.confirms: list[Confirm] = []  # written to etcd after the tick's kills and declarations
        self.publishes: list[PublishRank] = []  # this node's rank records, written after the confirmations
        self.settles: list[str] = []  # units whose processes are gone, stopped in systemd after the confirmations

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

    def declare(self, action: Declare, view: DeploymentView | None) -> None:
        """A generation declared failed in etcd: one compare-and-swap, from the slot in the agent's latest view."""
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
            entry = view.slots.get(action.cohort) if view is not None else None
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
                wake(self.probes.wake_fd, b"l")
        threading.Thread(target=ask, name=f"launch-{cohort}", daemon=True).start()

    def check_start(self, action: CheckStart) -> None:
        """A start's unit looked at in a thread of its own (observe.check_start: one or two ``systemctl show``,
        9-55 ms each on a loaded testbed host, every tick of a start); the answer wakes the loop."""
        self.node.checking[action.cohort] = action.generation  # one out per start: judge_starts clears it
        self.probes.answer_in_thread(f"start-check-{action.cohort}", self.probes.start_checks,
                                     lambda: observe.check_start(self.plan, self.host, action.cohort,
                                                                 action.generation), b"s")

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

    def probe_leader(self, action: ProbeLeader) -> None:
        """A leader's /health (and progress metrics) read in a thread of its own: the loop never waits on an
        engine, so a slow or hung leader delays no teardown, declaration or promotion; the answer wakes it."""
        self.node.probing[action.cohort] = action.generation  # one out per rank: judge_probes clears it
        self.probes.answer_in_thread(f"leader-probe-{action.cohort}", self.probes.leader_probes,
                                     lambda: observe.probe_leader(self.plan, action.cohort, action.generation,
                                                                  action.timeout, action.progress_timeout), b"h")
