"""shadowline-agent: one per node; detects failures of the cohorts' ranks, tears a failed generation down on
every node at once, verifies the promotion and relaunches a fresh shadow.

Run as ``python -m shadowline.control.agent --plan /etc/shadowline/<deployment>/plan.json --host <node>``.

Each agent owns its node's ranks (the engine units ``shadowline-<deployment>-engine@<cohort>``): it watches
their main processes through pidfds (an exit is known at once), their leaders' /health, and (stand-in) their
collective heartbeat. Agents agree through the deployment's etcd (coordination.py): a failure is declared with
one compare-and-swap, every agent kills its ranks of that generation and confirms, and the agent on the
leader node (the driver, where every cohort's leader and the failover lock live) verifies the promotion and
relaunches the slot once the old ranks are gone on every node, with growing delays on a crash loop.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import queue
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .agent_metrics import AgentMetrics
from .cohort_state import http_get, leader_base, leader_view, lock_holder
from .coordination import DEAD, FAILED, LAUNCHING, RUNNING, Coordination, Slot
from .discovery import cohort_registrations, listening_ports, revoke_leases
from ..drill.load import Request, completion_body, send
from .etcd_client import Etcd, EtcdError, Event
from .events import EventLog
from .lock import parse_holder
from .proc import (alive, cgroup_pids, kill_cgroup, monotonic_to_unix, pidfd_open, systemctl, terminate_cgroup,
                   unit_properties)
from ..standin.settings import heartbeat_path
from ..deployment.plan import unit_name

TICK_S = 0.05  # how often the loop looks at the lock and heartbeats when nothing wakes it
CHECK_S = 0.2  # how often it asks leaders' /health and (driver) re-reads the slots
SYNC_S = 1.0  # how often it re-reads the slots even without a watch event
LAUNCH_TIMEOUT_S = 300.0  # a launched generation whose leader never gets healthy is declared failed
START_JOB_S = 30.0  # a unit start job that has not made the unit active by then has failed
PROMOTION_TIMEOUT_S = 60.0  # lock taken -> active, registered and serving through the frontend
REVOKE_DEFER_MAX_S = 10.0  # longest the serving cohort's registration is kept while its successor wakes
SERVING_PROBE_S = 0.5  # while a node's agent is lost: how often the driver sends a completion through the frontend


@dataclass
class LocalRank:
    cohort: int
    generation: int
    unit: str
    pid: int
    pidfd: int | None
    cgroup: str | None
    leader: bool
    started: float  # when systemd started the rank's main process (unix time)
    healthy_seen: bool = False  # the leader's /health answered 200 once: from now on silence means hung
    heartbeat_seen: bool = False  # the collective heartbeat moved after the start: from now on a stall counts
    healthy_at: float = 0.0  # the last 200 from the leader's /health


@dataclass
class Teardown:
    """A rank sent SIGTERM, waiting for its grace to end (a planned failover lets engines drain)."""
    rank: LocalRank
    since: float  # the declaration, the base of the teardown time
    kill_at: float


@dataclass
class Promotion:
    """A cohort that took the failover lock, until the driver has verified that it serves."""
    cohort: int
    generation: int
    previous: str | None  # the holder before it
    lock_at: float
    deadline: float
    active_at: float | None = None  # its failover state metric says active
    leases: list[int] = field(default_factory=list)  # its discovery registration
    registered_at: float | None = None
    completion: Request | None = None  # the last verification request through the frontend
    probing: bool = False


class Agent:
    def __init__(self, plan: dict[str, Any], host: str, etcd: Etcd) -> None:
        self.plan = plan
        self.host = host
        self.failover = plan["failover"]
        self.coord = Coordination(etcd, plan["deployment"])
        self.etcd = etcd
        self.node_rank = next(n["rank"] for n in plan["nodes"] if n["host"] == host)
        self.address = next(n["address"] for n in plan["nodes"] if n["host"] == host)
        self.is_driver = self.node_rank == 0
        self.events = EventLog(f"{plan['state_dir']}/events.jsonl", host)
        self.metrics = AgentMetrics(plan["deployment"], host)
        self.ranks: dict[int, LocalRank] = {}
        self.confirmed: set[tuple[int, int]] = set()  # (cohort, generation) whose gone-ness this agent recorded
        self.detected_at: dict[tuple[int, int], float] = {}  # (cohort, generation) -> when its failure was declared
        self.launched_at: dict[tuple[int, int], float] = {}  # (cohort, generation) -> when the driver saw it launch
        self.starting: dict[int, tuple[int, float]] = {}  # cohort -> (generation, when) being started here
        self.terminating: dict[int, Teardown] = {}  # cohort -> a rank in its SIGTERM grace
        self.registered: dict[int, list[int]] = {}  # cohort -> discovery leases of its serving worker (driver)
        self.revoked: set[tuple[int, int]] = set()  # (cohort, generation) whose registration the driver revoked
        self.promotion: Promotion | None = None  # the lock's new holder until its serving is verified (driver)
        self.serving: int | None = None  # the cohort last verified serving (driver)
        self.agents_seen: set[str] = set()  # nodes whose agent the driver has seen registered
        self.agents_lost: dict[str, float] = {}  # node -> since when its agent's lease is gone (driver)
        self.serving_ok_at = 0.0  # the last completion through the frontend that succeeded (driver, nodes lost)
        self.serving_probe: Request | None = None
        self.next_serving_probe = 0.0
        self.holder: str | None = None  # the live lock holder, engine-<id>
        self.last_holder: str | None = None  # the holder before it, for promotion timing
        self.gms_pidfd: int | None = None
        self.lease = 0
        self.etcd_lost_since: float | None = None
        self.declare_errors: set[tuple[int, int]] = set()
        self.revision = 0  # the etcd revision the watch continues from
        self.next_keepalive = 0.0
        self.next_sync = 0.0
        self.next_check = 0.0
        self.stopping = False
        self.wake_r, self.wake_w = os.pipe()
        self.changes: queue.Queue[list[Event]] = queue.Queue()

    # --- the loop ------------------------------------------------------------------------------------------
    def run(self) -> None:
        self.register()
        self.adopt()
        threading.Thread(target=self.watch_loop, name="etcd-watch", daemon=True).start()
        self.events.write("agent-started", pid=os.getpid(), driver=self.is_driver,
                          adopted={c: r.pid for c, r in self.ranks.items()})
        while not self.stopping:
            exited = self.wait_for_wakeup(TICK_S)
            now = time.time()
            for cohort in exited:
                self.on_rank_exit(cohort, now)
            if self.starting:
                self.track_starting(now)
            if self.terminating:
                self.finish_teardowns(now)
            changes = self.drain_changes()
            changed = bool(changes)
            self.act_on_failures(changes)
            if changed or now >= self.next_sync:
                self.next_sync = now + SYNC_S
                self.reconcile(now)
            if changed or now >= self.next_check:
                self.next_check = now + (TICK_S if self.promotion else CHECK_S)  # a promotion: verify it closely
                self.track_gms()
                self.check_health(now)
                if self.is_driver:
                    self.drive(now)
            elif self.is_driver:
                self.watch_lock(now)
            self.keepalive(now)
        self.events.write("agent-stopped")

    def wait_for_wakeup(self, timeout: float) -> list[int]:
        """Block until a rank or the GMS server exits, etcd changes, or the tick passes; returns cohorts whose
        rank exited."""
        fds = {r.pidfd: c for c, r in self.ranks.items() if r.pidfd is not None}
        gms = [self.gms_pidfd] if self.gms_pidfd is not None else []
        readable, _, _ = select.select(list(fds) + gms + [self.wake_r], [], [], timeout)
        if self.wake_r in readable:
            os.read(self.wake_r, 4096)
        if gms and gms[0] in readable:
            self.on_gms_exit(time.time())
        return [fds[fd] for fd in readable if fd in fds]

    # --- the GMS server ----------------------------------------------------------------------------------------
    def track_gms(self) -> None:
        if self.gms_pidfd is not None:
            return
        props = unit_properties(unit_name(self.plan["deployment"], "gms"), "MainPID", "ActiveState")
        pid = int(props.get("MainPID", "0") or 0)
        if props.get("ActiveState") == "active" and pid:
            self.gms_pidfd = pidfd_open(pid)

    def on_gms_exit(self, now: float) -> None:
        """Engines keep the weights they mapped and go on serving; a new import would find the restarted server
        empty. Tell the driver, which has the writer (cohort 0) republish them (see republish_weights)."""
        assert self.gms_pidfd is not None
        os.close(self.gms_pidfd)
        self.gms_pidfd = None
        self.events.write("gms-lost")
        try:
            self.etcd.put(self.coord.keys.gms_lost(self.host), json.dumps({"time": now}))
        except EtcdError as err:
            self.events.write("gms-lost-unreported", error=str(err))

    # --- membership ------------------------------------------------------------------------------------------
    def register(self) -> None:
        self.lease = self.etcd.lease_grant(int(self.failover["agent_lease_ttl_s"]))
        self.revision = self.etcd.put(self.coord.keys.agent(self.host),
                                      json.dumps({"pid": os.getpid(), "since": time.time()}), lease=self.lease)

    def keepalive(self, now: float) -> None:
        if now < self.next_keepalive:
            return
        self.next_keepalive = now + max(0.2, self.failover["agent_lease_ttl_s"] / 3)
        try:
            if self.etcd.lease_keepalive(self.lease) <= 0:
                self.events.write("agent-lease-expired")
                self.register()
        except EtcdError as err:
            if self.etcd_lost_since is None:
                self.etcd_lost_since = now
                self.events.write("etcd-unreachable", error=str(err))
            return
        if self.etcd_lost_since is not None:
            self.events.write("etcd-reachable", after_s=round(now - self.etcd_lost_since, 3))
            self.etcd_lost_since = None

    def isolated(self, now: float) -> bool:
        """Cut off from etcd for longer than the agent lease: the others count this node as lost."""
        return self.etcd_lost_since is not None and now - self.etcd_lost_since > self.failover["agent_lease_ttl_s"]

    def watch_loop(self) -> None:
        """Wake the main loop whenever anything of the deployment changes in etcd."""
        revision = self.revision
        while not self.stopping:
            try:
                events = self.etcd.watch(self.coord.keys.root, revision, timeout=1.0)
            except EtcdError:
                time.sleep(0.2)
                continue
            if events:
                revision = max(e.mod_revision for e in events)
                self.changes.put(events)
                os.write(self.wake_w, b"w")

    def drain_changes(self) -> list[Event]:
        events: list[Event] = []
        while not self.changes.empty():
            events += self.changes.get_nowait()
        return events

    def act_on_failures(self, changes: list[Event]) -> None:
        """Tear down at once what the watch says has failed, from the event itself (no second read of the
        slots first: this is the hot path of a failover on every node)."""
        prefix = self.coord.keys.slots()
        for change in changes:
            if change.type != "put" or not change.key.startswith(prefix):
                continue
            slot = Slot(**json.loads(change.value))
            self.tear_down_failed(slot)

    # --- local ranks -------------------------------------------------------------------------------------------
    def adopt(self) -> None:
        """Take over ranks that already run (after an agent restart, or started by the engine role)."""
        slots = self.coord.slots()
        if self.is_driver:
            active = self.coord.active()
            self.serving = int(active["cohort"]) if active else None
        for cohort in self.plan["cohorts"]:
            c = cohort["cohort"]
            slot = slots.get(c, (None, 0))[0]
            generation = slot.generation if slot else 1
            rank = self.track(c, generation)
            if rank is None:
                continue
            if slot is not None and slot.state == RUNNING:  # it was healthy before this agent started
                rank.healthy_seen = rank.heartbeat_seen = True
                rank.healthy_at = time.time()
            if self.is_driver and slot is None:
                self.coord.create_slot(Slot(cohort=c, generation=generation, state=RUNNING))
        if self.is_driver:
            for cohort in self.plan["cohorts"]:  # slots whose ranks do not run: launch them
                c = cohort["cohort"]
                if c not in self.ranks and c not in slots:
                    self.coord.create_slot(Slot(cohort=c, generation=1, state=LAUNCHING, reason="not running"))

    def track(self, cohort: int, generation: int) -> LocalRank | None:
        unit = unit_name(self.plan["deployment"], "engine", cohort)
        props = unit_properties(unit, "MainPID", "ActiveState", "ControlGroup", "ExecMainStartTimestampMonotonic")
        pid = int(props.get("MainPID", "0") or 0)
        if props.get("ActiveState") != "active" or not pid:
            self.ranks.pop(cohort, None)
            return None
        pidfd = pidfd_open(pid)
        if pidfd is None:  # exited between systemctl's answer and now: the unit is about to be inactive
            self.ranks.pop(cohort, None)
            return None
        started = monotonic_to_unix(props.get("ExecMainStartTimestampMonotonic", "0")) or time.time()
        rank = LocalRank(cohort=cohort, generation=generation, unit=unit, pid=pid, pidfd=pidfd,
                         cgroup=props.get("ControlGroup") or None, leader=self.node_rank == 0, started=started)
        self.ranks[cohort] = rank
        return rank

    def on_rank_exit(self, cohort: int, now: float) -> None:
        rank = self.ranks.pop(cohort)
        if rank.pidfd is not None:
            os.close(rank.pidfd)
            rank.pidfd = None
        self.events.write("rank-exited", cohort, rank.generation, pid=rank.pid)
        self.declare(rank.cohort, rank.generation, "rank-exited", now)
        self.tear_down(rank, now)

    def declare(self, cohort: int, generation: int, reason: str, now: float) -> None:
        try:
            slot = self.coord.declare_failed(cohort, generation, reason, self.host)
        except EtcdError as err:
            if (cohort, generation) not in self.declare_errors:
                self.declare_errors.add((cohort, generation))
                self.events.write("declare-failed-error", cohort, generation, reason=reason, error=str(err))
            return
        if slot is not None:
            self.detected_at[(cohort, generation)] = now
            self.metrics.count("detections_total", reason)
            self.events.write("failure-declared", cohort, generation, reason=reason)

    def tear_down(self, rank: LocalRank, since: float, grace: float | None = None) -> None:
        """Kill every process of the rank (its unit's cgroup), confirm, and record it in etcd. With a grace
        (a planned failover), SIGTERM now and SIGKILL whatever is left when it ends, without blocking the loop."""
        grace = float(self.failover["term_grace_s"]) if grace is None else grace
        self.ranks.pop(rank.cohort, None)
        if grace > 0 and rank.cgroup:
            kill_cgroup(rank.cgroup, signal.SIGTERM)
            self.terminating[rank.cohort] = Teardown(rank=rank, since=since, kill_at=time.time() + grace)
            self.events.write("ranks-terminating", rank.cohort, rank.generation, grace_s=grace)
            return
        self.finish_teardown(rank, since)

    def finish_teardowns(self, now: float) -> None:
        for cohort, teardown in list(self.terminating.items()):
            if teardown.rank.cgroup and cgroup_pids(teardown.rank.cgroup) and now < teardown.kill_at:
                continue
            del self.terminating[cohort]
            self.finish_teardown(teardown.rank, teardown.since)

    def finish_teardown(self, rank: LocalRank, since: float) -> None:
        gone = terminate_cgroup(rank.cgroup, 0.0) if rank.cgroup else not alive(rank.pid)
        done = time.time()
        if rank.pidfd is not None:
            os.close(rank.pidfd)
            rank.pidfd = None
        if gone:
            self.confirm(rank.cohort, rank.generation, done)
        systemctl("stop", "--no-block", rank.unit)  # settle the unit; its processes are already gone
        self.metrics.count("teardowns_total")
        self.events.write("ranks-gone" if gone else "ranks-not-gone", rank.cohort, rank.generation, when=done,
                          seconds=round(done - since, 4))

    def teardown_grace(self, slot: Slot) -> float:
        """A planned failover lets the engines drain (SIGTERM, planned_grace_s); a failure kills at once."""
        key = "planned_grace_s" if slot.reason == "planned-failover" else "term_grace_s"
        return float(self.failover[key])

    def confirm(self, cohort: int, generation: int, when: float) -> None:
        if (cohort, generation) in self.confirmed:
            return
        try:
            self.coord.confirm_gone(cohort, generation, self.host, when)
            self.confirmed.add((cohort, generation))
        except EtcdError as err:
            self.events.write("confirm-error", cohort, generation, error=str(err))

    def launch(self, cohort: int, generation: int, now: float) -> None:
        """Start this node's rank of a new generation without waiting for it (the loop tracks it next)."""
        unit = unit_name(self.plan["deployment"], "engine", cohort)
        systemctl("reset-failed", unit)
        systemctl("start", "--no-block", unit)
        self.starting[cohort] = (generation, now)

    def track_starting(self, now: float) -> None:
        for cohort, (generation, since) in list(self.starting.items()):
            rank = self.track(cohort, generation)
            if rank is None:
                failure = self.start_failure(cohort, since, now)
                if failure is None:
                    continue  # the start job is still queued or running
                del self.starting[cohort]
                status = systemctl("status", "--no-pager", "-n", "5", unit_name(self.plan["deployment"], "engine", cohort))
                self.events.write("launch-failed", cohort, generation, failure=failure,
                                  status=status.stdout.strip()[-400:])
                self.declare(cohort, generation, "launch-failed", now)
                continue
            del self.starting[cohort]
            self.metrics.count("relaunches_total")
            detected = self.detected_at.get((cohort, generation - 1))
            if detected:
                self.metrics.observe("relaunch_seconds", now - detected)
            self.events.write("rank-launched", cohort, generation, pid=rank.pid)

    def start_failure(self, cohort: int, since: float, now: float) -> str | None:
        """Why a unit this agent started is not running, as soon as systemd says so; None while it starts."""
        props = unit_properties(unit_name(self.plan["deployment"], "engine", cohort), "ActiveState", "SubState", "Result")
        state = props.get("ActiveState", "unknown")
        if state == "failed":
            return f"the unit failed ({props.get('Result', '?')})"
        if state in ("inactive", "deactivating") and now - since > 2.0:
            return f"the unit is {state}: its start job did not run or it exited at once"
        if now - since > START_JOB_S:
            return f"the unit is still {state}/{props.get('SubState', '?')} after {START_JOB_S:.0f} s"
        return None

    # --- what the slots say ------------------------------------------------------------------------------------
    def reconcile(self, now: float) -> None:
        """Make this node's ranks match the slot records."""
        try:
            slots = self.coord.slots()
        except EtcdError:
            return
        for cohort, (slot, _revision) in slots.items():
            self.abandon_stale_start(cohort, slot)
            rank = self.ranks.get(cohort)
            if slot.state in (FAILED, DEAD):
                if not self.tear_down_failed(slot) and slot.state == FAILED and cohort not in self.terminating:
                    self.confirm(cohort, slot.generation, now)  # nothing of it here (any more)
            elif slot.state in (LAUNCHING, RUNNING):
                if rank is not None and rank.generation < slot.generation:
                    self.tear_down(rank, now)  # a leftover of an older generation
                    rank = None
                if rank is None and (cohort in self.starting or cohort in self.terminating):
                    continue
                if rank is None and now >= slot.not_before:
                    self.detected_at.setdefault((cohort, slot.generation - 1), slot.since)
                    self.launch(cohort, slot.generation, now)
                elif rank is None:
                    self.next_sync = min(self.next_sync, slot.not_before)  # wake for the delayed launch

    def tear_down_failed(self, slot: Slot) -> bool:
        """This node's rank of a generation declared failed (or dead): tear it down. False if there is none."""
        rank = self.ranks.get(slot.cohort)
        if slot.state not in (FAILED, DEAD) or rank is None or rank.generation > slot.generation:
            return False
        self.events.write("teardown-requested", slot.cohort, slot.generation, reason=slot.reason,
                          by=slot.detected_by)
        self.detected_at.setdefault((slot.cohort, slot.generation), slot.since)
        self.tear_down(rank, slot.since, self.teardown_grace(slot))
        return True

    def abandon_stale_start(self, cohort: int, slot: Slot) -> None:
        """A start this agent began for a generation that failed or was superseded meanwhile: stop it, so that
        the slot's record and this node agree (and a newer generation is not held up by it)."""
        start = self.starting.get(cohort)
        if start is None:
            return
        generation = start[0]
        if generation >= slot.generation and not (slot.state in (FAILED, DEAD) and generation == slot.generation):
            return
        del self.starting[cohort]
        systemctl("stop", unit_name(self.plan["deployment"], "engine", cohort))
        self.events.write("launch-abandoned", cohort, generation, slot_generation=slot.generation,
                          slot_state=slot.state)

    # --- health -----------------------------------------------------------------------------------------------
    def check_health(self, now: float) -> None:
        """Hung leaders (no /health answer) and stalled collectives (no heartbeat progress). A rank is only
        judged once it has been healthy (leader) or its heartbeat has moved (every rank) since its start: weight
        loading takes as long as it takes; a start that never ends is the driver's launch timeout."""
        for rank in list(self.ranks.values()):
            reason = self.hang_reason(rank)
            if not reason:
                continue
            now = time.time()  # after the probe: a health check may have waited for its timeout
            self.declare(rank.cohort, rank.generation, reason, now)
            if reason == "collective-stalled" and self.isolated(now):
                # Fence: cut off from etcd AND from this cohort's peers (its collective stalled), so the other
                # nodes have declared it failed; kill it here too. An etcd outage alone (collectives still
                # progressing) never costs a serving cohort.
                self.events.write("fenced", rank.cohort, rank.generation, isolated_s=round(now - self.etcd_lost_since, 3))
                self.tear_down(rank, now)

    def hang_reason(self, rank: LocalRank) -> str | None:
        if self.plan["backend"] == "standin":
            path = heartbeat_path(str(rank.cohort), self.node_rank, os.path.dirname(self.plan["lock_path"]))
            try:
                beat = os.stat(path).st_mtime
            except FileNotFoundError:
                beat = None
            if beat is not None and beat >= rank.started:
                rank.heartbeat_seen = True  # a beat of this process, not a leftover of an earlier generation
            if rank.heartbeat_seen and beat is not None and time.time() - beat > self.failover["heartbeat_stall_s"]:
                return "collective-stalled"
        if not rank.leader:
            return None
        timeout = float(self.failover["health_timeout_s"])
        # Hung = no healthy answer for health_timeout_s since the last one; the probe waits at most until then.
        left = rank.healthy_at + timeout - time.time() if rank.healthy_seen else 0.5
        answer = http_get(f"{leader_base(self.plan, rank.cohort)}/health", min(0.5, max(0.05, left)))
        if answer is not None and answer[0] == 200:
            rank.healthy_seen = True
            rank.healthy_at = time.time()
            return None
        if not rank.healthy_seen:
            return None  # still loading (vLLM answers 503 until then)
        deadline = rank.healthy_at + timeout
        if time.time() >= deadline:
            return "leader-hung"
        self.next_check = min(self.next_check, deadline)  # decide at the deadline, not a check period later
        return None


    # --- the driver (leader node): promotion and relaunch --------------------------------------------------------
    def drive(self, now: float) -> None:
        self.watch_lock(now)
        self.republish_weights()
        try:
            slots = self.coord.slots()
        except EtcdError:
            return
        self.verify_promotion(slots)
        self.watch_agents(slots, now)
        for cohort, (slot, revision) in slots.items():
            if slot.state == FAILED:
                self.revoke_registration(slot, slots, now)
                self.relaunch_when_gone(slot, revision, now)
            elif slot.state == LAUNCHING and now >= slot.not_before:
                self.mark_running_when_parked(slot, revision, now)
            elif slot.state == RUNNING and slot.attempts and now - slot.since > self.failover["stable_after_s"]:
                slot.attempts = 0
                self.coord.swap(slot, revision)

    def republish_weights(self) -> None:
        """After a GMS server died, relaunch the writer cohort (ENGINE_ID=0 loads from disk and publishes) so
        the weights are resident again for future shadows. If cohort 0 is serving, a parked shadow takes over
        first (one planned failover); with no parked shadow, serving is left alone and the gap is reported."""
        try:
            lost = self.etcd.get_prefix(self.coord.keys.gms_lost())
            if not lost:
                return
            slots = self.coord.slots()
        except EtcdError:
            return
        hosts = [kv.key.rsplit("/", 1)[-1] for kv in lost]
        zero = slots.get(0)
        serving = parse_holder(self.holder or "")
        parked = [c for c, (slot, _) in slots.items() if c != 0 and slot.state == RUNNING and c != serving]
        if zero is None or zero[0].state != RUNNING:
            self.events.write("gms-republish", 0, None, nodes=hosts, detail="the writer is relaunching already")
        elif serving != 0 or parked:
            self.events.write("gms-republish", 0, zero[0].generation, nodes=hosts, serving=serving)
            self.declare(0, zero[0].generation, "gms-republish", time.time())
        else:
            self.events.write("gms-degraded", 0, zero[0].generation, nodes=hosts,
                              detail="no parked shadow can take over while the writer republishes; serving "
                                     "continues, but a failover now would find no resident weights")
        for kv in lost:
            self.etcd.delete(kv.key)

    def revoke_registration(self, slot: Slot, slots: dict[int, tuple[Slot, int]], now: float) -> None:
        """Take a failed cohort out of discovery, so the frontend stops routing to it: at once, unless it was
        the serving cohort and a shadow is taking over. Then the dead registration stays until the successor
        has registered (at most REVOKE_DEFER_MAX_S): the frontend keeps the model and retries a request that
        meets the dead worker on the new one (request migration); revoked earlier, the frontend would drop the
        model and answer 404 until it has loaded the successor's model card again."""
        if (slot.cohort, slot.generation) in self.revoked:
            return
        if slot.cohort == self.serving and now - self.detected_at.get((slot.cohort, slot.generation), slot.since) \
                < REVOKE_DEFER_MAX_S:
            waking = self.promotion is not None and self.promotion.cohort != slot.cohort \
                and not self.promotion.leases
            parked = [c for c, (s, _) in slots.items() if c != slot.cohort and s.state == RUNNING]
            if waking or (self.promotion is None and parked):
                return
        self.revoked.add((slot.cohort, slot.generation))
        leases = self.registered.pop(slot.cohort, [])
        try:
            leases += [r.lease for r in cohort_registrations(self.etcd, self.plan, slot.cohort)]
            revoked = revoke_leases(self.etcd, leases) if leases else []
        except EtcdError as err:
            self.events.write("revoke-error", slot.cohort, slot.generation, error=str(err))
            return
        if revoked:
            self.events.write("registration-revoked", slot.cohort, slot.generation,
                              leases=[f"{lease:x}" for lease in revoked])

    def relaunch_when_gone(self, slot: Slot, revision: int, now: float) -> None:
        nodes = {n["host"] for n in self.plan["nodes"]}
        gone = self.coord.gone_hosts(slot.cohort, slot.generation)
        if not nodes <= set(gone):
            return
        detected = self.detected_at.get((slot.cohort, slot.generation), slot.since)
        teardown_s = max(gone.values()) - detected
        self.metrics.observe("teardown_seconds", teardown_s)
        self.events.write("generation-gone", slot.cohort, slot.generation, teardown_s=round(teardown_s, 4),
                          per_node={h: round(t - detected, 4) for h, t in gone.items()})
        attempts = slot.attempts + 1 if self.ran_briefly(slot) else 0
        if attempts > int(self.failover["max_relaunch_attempts"]):
            dead = Slot(cohort=slot.cohort, generation=slot.generation, state=DEAD, reason="crash-loop",
                        attempts=attempts)
            if self.coord.swap(dead, revision):
                self.metrics.count("slots_dead_total")
                self.events.write("slot-dead", slot.cohort, slot.generation, attempts=attempts,
                                  detail="crash loop: relaunches stopped; fix the cause, then run playbooks/failover.yml")
            return
        delay = 0.0 if attempts == 0 else min(self.failover["relaunch_backoff_s"] * 2 ** (attempts - 1),
                                              self.failover["relaunch_backoff_max_s"])
        launching = Slot(cohort=slot.cohort, generation=slot.generation + 1, state=LAUNCHING,
                         reason=f"relaunch after {slot.reason}", attempts=attempts, not_before=now + delay)
        if self.coord.swap(launching, revision):
            self.detected_at[(slot.cohort, slot.generation)] = detected
            self.launched_at[(slot.cohort, slot.generation + 1)] = now + delay  # a launch can fail before the next pass
            self.events.write("relaunch-scheduled", slot.cohort, slot.generation + 1, delay_s=round(delay, 3),
                              attempts=attempts)

    def ran_briefly(self, slot: Slot) -> bool:
        """Did the failed generation fail soon after its launch (a crash loop in the making)?"""
        if slot.reason in ("launch-failed", "launch-timeout"):
            return True
        launched = self.launched_at.get((slot.cohort, slot.generation))
        return launched is not None and slot.since - launched < self.failover["stable_after_s"]

    def mark_running_when_parked(self, slot: Slot, revision: int, now: float) -> None:
        self.launched_at.setdefault((slot.cohort, slot.generation), now)
        rank = self.ranks.get(slot.cohort)
        if rank is None or rank.generation != slot.generation:
            return
        answer = http_get(f"{leader_base(self.plan, slot.cohort)}/health", 0.5)
        if answer is not None and answer[0] == 200:
            running = Slot(cohort=slot.cohort, generation=slot.generation, state=RUNNING, reason="parked",
                           attempts=slot.attempts)
            if self.coord.swap(running, revision):
                detected = self.detected_at.get((slot.cohort, slot.generation - 1))
                self.events.write("relaunch-complete", slot.cohort, slot.generation,
                                  relaunch_s=round(time.time() - detected, 4) if detected else None)
        elif now - self.launched_at[(slot.cohort, slot.generation)] > LAUNCH_TIMEOUT_S:
            self.declare(slot.cohort, slot.generation, "launch-timeout", now)

    def watch_lock(self, now: float) -> None:
        """Notice a new lock holder (every tick) and start verifying its promotion."""
        holder = lock_holder(self.plan["lock_path"])
        if holder == self.holder:
            return
        if self.holder is not None:
            self.last_holder = self.holder
        self.holder = holder
        if holder is None:
            self.events.write("lock-free", previous=self.last_holder)
            return
        cohort = parse_holder(holder)
        if cohort is None or cohort >= len(self.plan["cohorts"]):
            self.events.write("lock-unknown-holder", holder=holder)
            return
        rank = self.ranks.get(cohort)
        try:
            slot = self.coord.slot(cohort)[0]
        except EtcdError:
            slot = None
        if rank is None or slot is None or slot.state in (FAILED, DEAD) or rank.generation != slot.generation:
            # e.g. a shadow whose own generation is being torn down grabbed the lock on its way out
            self.events.write("lock-taken-by-failing", cohort, rank.generation if rank else None, holder=holder,
                              slot=f"{slot.state} generation {slot.generation}" if slot else None)
            return
        previous = self.last_holder
        detected = self.failure_of(previous)
        lock_s = now - detected if detected is not None else None
        self.promotion = Promotion(cohort=cohort, generation=rank.generation, previous=previous, lock_at=now,
                                   deadline=now + PROMOTION_TIMEOUT_S)
        self.events.write("lock-acquired", cohort, rank.generation, previous=previous,
                          lock_s=round(lock_s, 4) if lock_s is not None else None)

    def failure_of(self, holder: str | None) -> float | None:
        """When the latest failure of the lock holder ``holder``'s cohort was declared (None: none known)."""
        cohort = parse_holder(holder or "")
        failed = [t for (c, _g), t in self.detected_at.items() if cohort is not None and c == cohort]
        return max(failed) if failed else None

    def verify_promotion(self, slots: dict[int, tuple[Slot, int]]) -> None:
        """The new holder is promoted when its failover state is active, its registration is in discovery
        and a completion goes through the frontend; then its predecessor's registration can go."""
        p = self.promotion
        if p is None:
            return
        slot = slots.get(p.cohort, (None, 0))[0]
        if self.holder != f"engine-{p.cohort}" or slot is None or slot.state in (FAILED, DEAD) \
                or slot.generation != p.generation:
            self.events.write("promotion-abandoned", p.cohort, p.generation, holder=self.holder,
                              slot=slot.state if slot else None)
            self.promotion = None
            return
        now = time.time()
        if p.active_at is None:
            view = leader_view(self.plan, p.cohort, 0.5)
            if view is not None and view.state == "active":
                p.active_at = time.time()
        if p.active_at is not None and not p.leases:
            rank = self.ranks.get(p.cohort)
            ports = listening_ports(cgroup_pids(rank.cgroup)) if rank and rank.cgroup else set()
            try:
                p.leases = [r.lease for r in cohort_registrations(self.etcd, self.plan, p.cohort, ports)]
            except EtcdError:
                p.leases = []
            if p.leases:
                p.registered_at = time.time()
                self.registered[p.cohort] = p.leases
                self.events.write("registered", p.cohort, p.generation, leases=[f"{x:x}" for x in p.leases])
        if p.leases and not p.probing:
            if p.completion is not None and p.completion.ok:
                self.promoted(p)
                return
            p.probing = True
            threading.Thread(target=self.probe_frontend, args=(p,), name="promotion-probe", daemon=True).start()
        if now > p.deadline:
            missing = "its active state" if p.active_at is None else "its registration" if not p.leases \
                else f"a completion through the frontend ({p.completion.error if p.completion else 'no answer'})"
            self.metrics.count("promotions_unverified_total")
            self.events.write("promotion-unverified", p.cohort, p.generation, missing=missing,
                              waited_s=round(now - p.lock_at, 3))
            self.promotion = None

    def watch_agents(self, slots: dict[int, tuple[Slot, int]], now: float) -> None:
        """A node whose agent's lease expired: nobody watches its ranks. Its loss alone fails no cohort (the ranks
        may be fine, and every cohort has a rank on every node); a node that is really gone shows in its peers'
        collectives and the leader's health. What neither may show (vLLM's /health can stay 200 after a worker
        rank died) is caught here: while any agent is lost, the driver sends a completion through the frontend
        every SERVING_PROBE_S, and declares the serving generation failed (node-lost) when none has succeeded
        for health_timeout_s plus the request timeout."""
        try:
            live = self.coord.live_agents()
        except EtcdError:
            return
        self.agents_seen |= live
        for node in sorted(self.agents_seen - {self.host}):
            if node in live and node in self.agents_lost:
                self.events.write("agent-back", node=node, lost_s=round(now - self.agents_lost.pop(node), 3))
            elif node not in live and node not in self.agents_lost:
                self.agents_lost[node] = now
                self.serving_ok_at = now
                self.metrics.count("agents_lost_total")
                self.events.write("agent-lost", node=node,
                                  detail="its ranks are unsupervised; serving is probed through the frontend")
        if not self.agents_lost or self.serving is None or self.promotion is not None:
            return
        probe = self.serving_probe
        if probe is not None and probe.ok:
            self.serving_ok_at = max(self.serving_ok_at, probe.end)
        if now >= self.next_serving_probe:
            self.next_serving_probe = now + SERVING_PROBE_S
            threading.Thread(target=self.probe_serving, name="serving-probe", daemon=True).start()
        slot = slots.get(self.serving, (None, 0))[0]
        silent = now - self.serving_ok_at
        if slot is not None and slot.state == RUNNING and silent > float(self.failover["health_timeout_s"]) + 2.0:
            self.events.write("serving-silent", self.serving, slot.generation, silent_s=round(silent, 3),
                              lost=sorted(self.agents_lost))
            self.declare(self.serving, slot.generation, "node-lost", now)

    def frontend_completion(self) -> Request:
        """One short completion through the frontend (callers run it in a thread: the loop never waits for it)."""
        return send(self.plan["infra"]["frontend_url"], completion_body(self.plan["model_id"], 1), 2.0, 0)

    def probe_serving(self) -> None:
        self.serving_probe = self.frontend_completion()

    def probe_frontend(self, p: Promotion) -> None:
        p.completion = self.frontend_completion()
        p.probing = False
        self.next_check = 0.0
        os.write(self.wake_w, b"p")

    def promoted(self, p: Promotion) -> None:
        self.promotion = None
        self.serving = p.cohort
        detected = self.failure_of(p.previous)
        promote_s = p.completion.end - detected if p.completion and detected is not None else None
        try:
            self.coord.record_active(p.cohort, p.generation)
        except EtcdError as err:
            self.events.write("record-active-error", p.cohort, p.generation, error=str(err))
        self.metrics.count("promotions_total")
        if promote_s is not None:
            self.metrics.observe("promotion_seconds", promote_s)
        self.events.write("promoted", p.cohort, p.generation, previous=p.previous, state="active",
                          promote_s=round(promote_s, 4) if promote_s is not None else None,
                          lock_s=round(p.lock_at - detected, 4) if detected is not None else None,
                          active_s=round(p.active_at - p.lock_at, 4) if p.active_at else None,
                          registered_s=round(p.registered_at - p.lock_at, 4) if p.registered_at else None,
                          completion_s=round(p.completion.end - p.lock_at, 4) if p.completion else None)


# --- the metrics endpoint and the command line -----------------------------------------------------------------
def serve_metrics(agent: Agent, address: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            if self.path not in ("/metrics", "/health"):
                self.send_error(404)
                return
            body = (agent.metrics.render() if self.path == "/metrics" else "ok\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((address, port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def single_instance(path: str) -> int:
    """Hold an exclusive lock for the agent's lifetime: two agents on one node cannot both act."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"shadowline-agent: another agent holds {path}; refusing to run a second one", file=sys.stderr)
        raise SystemExit(3) from None
    return fd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shadowline-agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", required=True, help="the cohort plan (JSON), as the agent role writes it")
    parser.add_argument("--host", required=True, help="this node's name in the plan")
    args = parser.parse_args(argv)
    with open(args.plan, encoding="utf-8") as handle:
        plan = json.load(handle)
    if args.host not in [n["host"] for n in plan["nodes"]]:
        parser.error(f"--host {args.host} is not a node of deployment {plan['deployment']}")
    _lock = single_instance(f"{plan['state_dir']}/agent-{args.host}.lock")
    agent = Agent(plan, args.host, Etcd(plan["infra"]["etcd_endpoints"]))

    def stop(_signum: int, _frame: Any) -> None:
        agent.stopping = True
        os.write(agent.wake_w, b"s")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    serve_metrics(agent, agent.address, int(plan["ports"]["agent_metrics"]))
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
