"""shadowline-agent: one per node; detects failures of the cohorts' ranks, tears a failed generation down on
every node at once, verifies the promotion and relaunches a fresh shadow.

Run as ``python -m shadowline.control.agent --plan /etc/shadowline/<deployment>/plan.json --host <node>``.

Each agent owns its node's ranks (the engine units ``shadowline-<deployment>-engine@<cohort>``): it watches
their main processes through pidfds (an exit is known at once), their leaders' /health and generation progress
(vLLM's metrics), an idle serving cohort with canary completions, and the node's GPU health events. Agents agree through the deployment's etcd
(coordination.py): a failure is declared with one compare-and-swap, every agent kills its ranks of that
generation and confirms, and the agent on the leader node (the driver, where every cohort's leader and the
failover lock live) verifies the promotion and relaunches the slot once the old ranks are gone on every node,
with growing delays on a crash loop.

The loop below is the whole agent, top to bottom. The etcd feed (feed.py, a thread) keeps the agent's lease,
watches the deployment and reads its view (view.py: one range read of its etcd prefix); each tick the loop
takes what the feed brought and hands it with the clock to the node's duties (node_duties.py) and, on node
rank 0, the driver's (driver_duties.py): pure decisions that return actions, performed by the executor
(executor.py). Local deaths are handled before anything waits on etcd. An error in one tick is reported and
the loop goes on; systemd's watchdog restarts an agent whose loop stops ticking.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import select
import signal
import time
import traceback
from typing import Any

from ..cluster.access import agent_server_context, etcd_for
from ..common import console
from ..common.coordination import Coordination, agent_instance
from ..common.etcd_client import Etcd
from ..common.events import EventLog
from ..common.proc import cgroup_events, cgroup_populated, pidfd_open
from ..common.systemd_notify import SystemdNotifier
from ..deployment.plan import Plan, gpu_hosts, spare_hosts
from . import observe
from .actions import ReportFault
from .agent_metrics import CONTENT_TYPE, AgentMetrics, MetricsUnavailable
from .driver_duties import DriverDuties
from .executor import ERROR_REPORT_S, Executor, Schedule
from .failure_notices import PEER_IDLE_S, Inbox, Notifier, sender_node
from .feed import EtcdFeed, FeedNews
from .gpu_watch import GpuWatch
from .memory import DriverMemory, NodeMemory, Teardown
from .metrics_server import serve
from .node_duties import NodeDuties
from .spare_agent import SpareAgent
from .view import DeploymentView, Now

TICK_S = 0.05  # how often the loop looks at the lock and the teardowns when nothing wakes it
TEARDOWN_TICK_S = 0.005  # a teardown whose cgroup's emptying cannot wake the loop (no cgroup.events) is read this often
CHECK_S = 0.2  # how often it asks leaders' /health and (driver) drives
SYNC_S = 1.0  # how often a node's feed reads the view even without a watch event (the driver's: every CHECK_S)
STALLED_S = 5.0  # the metrics port's /health answers 503 when the loop has not ticked for this long


class Agent:
    def __init__(self, plan: Plan, host: str, etcd: Etcd, feed_etcd: Etcd, lease_etcd: Etcd | None = None) -> None:
        replica = plan.replica_of(host)
        plan = plan.for_replica(replica.id)  # it drives, tells and hears its own replica only
        self.plan = plan
        self.host = host
        self.etcd = etcd
        self.coord = Coordination(etcd, plan.deployment, replica.id)
        self.is_driver = plan.node(host).rank == 0
        self.events = EventLog(plan.events_path, host, deployment=plan.deployment)
        self.metrics = AgentMetrics(plan.deployment, host, plan.cohort_ids, driver=self.is_driver,
                                    model_dir=plan.model_dir, spares_wanted=plan.failover.min_spares)
        self.schedule = Schedule()
        self.memory = NodeMemory(instance=agent_instance(os.getpid(), time.time_ns()))
        self.driver_memory = DriverMemory() if self.is_driver else None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.inbox = Inbox(plan, self.wake_w)  # other agents' failure notices, from the endpoint's threads
        self.notifier = Notifier(plan, host, self.wake_w)
        self.execute = Executor(plan, host, etcd, self.events, self.metrics, self.memory, self.driver_memory,
                                self.schedule, self.wake_w, self.notifier)
        self.node = NodeDuties(plan, host, self.memory, self.execute)
        self.driver = DriverDuties(plan, host, self.memory, self.driver_memory,
                                   self.execute) if self.driver_memory is not None else None
        self.feed = EtcdFeed(feed_etcd, self.coord.keys, host, replica.members,
                             frozenset(plan.cohort_ids),
                             int(plan.failover.agent_lease_ttl_s), CHECK_S if self.is_driver else SYNC_S, self.wake_w,
                             lease_etcd, self.memory.instance)
        self.gpu = GpuWatch(plan.engine.gpu_events, plan.state_dir, self.wake_w, plan.engine.gpu_event_source)
        self.view: DeploymentView | None = None  # the latest view the feed read
        self.gms_pidfd: int | None = None
        self.cgroup_events: dict[int, int] = {}  # cohort -> its unit's cgroup.events, while its rank is torn down
        self.stopping = False
        self.systemd = SystemdNotifier()
        self.last_tick = time.monotonic()
        self.last_error: tuple[str, float] = ("", 0.0)

    # --- the loop ------------------------------------------------------------------------------------------
    def run(self) -> None:
        self.adopt()
        self.feed.start()
        self.gpu.start()
        self.notifier.start()
        self.events.write("agent-started", pid=os.getpid(), driver=self.is_driver,
                          adopted={c: r.pid for c, r in self.memory.ranks.items()})
        self.systemd.ready(f"watching {len(self.memory.ranks)} ranks")
        while not self.stopping:
            exited, gms_exited = self.wait_for_wakeup()
            try:
                self.tick(exited, gms_exited)
            except Exception as err:  # noqa: BLE001 (one tick's error must never end the agent)
                self.tick_failed(err)
            self.last_tick = time.monotonic()
            self.systemd.alive()
        self.systemd.stopping()
        self.feed.stop.set()
        self.notifier.stop.set()
        self.events.write("agent-stopped")

    def tick(self, exited: list[int], gms_exited: bool) -> None:
        now = Now.read()
        for cohort in exited:  # local first: the rest of a dead rank is killed before anything waits on etcd
            self.node.on_rank_exit(cohort, now)
        self.take_failure_notices()  # then what other nodes' agents declared and told this one directly
        if gms_exited:
            self.node.on_gms_exit(now)
        faults, notices = self.gpu.take()
        for notice in notices:
            self.events.write(notice.event, detail=notice.detail)
        if faults:  # local first too: the ranks on a failed GPU are killed before anything waits on etcd
            self.node.on_gpu_faults(faults, self.view, now)
        news = self.take_news()
        self.node.on_slot_changes(news.slots)  # the hot path: a declared failure torn down from the event itself
        if self.execute.take_probe_results():
            self.schedule.next_check = 0.0  # a look at the promotion or its completion answered: verify at once
        if self.node.judge_probes(self.execute.take_leader_probes()) and self.driver is not None:
            self.schedule.next_check = 0.0  # a leader's first 200 (the leaders' probes answer as they come)
        self.node.judge_starts(self.execute.take_start_checks())  # the starts' units, as their looks answer
        if self.memory.starting:
            self.node.track_starts(now)
        if self.memory.terminating:
            self.node.finish_teardowns(now)
        view = self.schedule.view_to_reconcile(news.view, self.view, now.mono)
        if view is not None:
            self.node.reconcile(view, now)
        if news.view is not None:
            self.metrics.show_view(news.view)
        if now.mono >= self.schedule.next_sync:
            self.schedule.next_sync = now.mono + SYNC_S
            self.metrics.show_node(gms_server_up=self.gms_pidfd is not None)
        check = now.mono >= self.schedule.next_check
        if check:
            promoting = self.driver_memory is not None and self.driver_memory.promotion is not None
            self.schedule.next_check = now.mono + (TICK_S if promoting else CHECK_S)  # verify it closely
            self.track_gms()
            self.node.check_health()
        if self.driver is not None and self.view is not None:  # the driver acts once it has seen the slots
            self.driver.watch_lock(self.driver.holder(), self.view, now)
            etcd_answers = self.memory.etcd_lost_since is None
            if etcd_answers and (check or news.view is not None):
                self.driver.drive(self.view, Now.read())
        self.execute.flush()  # confirmations last: after this tick's kills and declarations

    def take_news(self) -> FeedNews:
        """What the etcd feed brought since the last tick; its notices go to the event log."""
        news = self.feed.take()
        for notice in news.notices:
            self.events.write(notice.event, **notice.fields)
        lost = self.memory.etcd_lost_since
        if lost is not None and news.lost_since is None and self.driver is not None:
            self.driver.etcd_back(time.monotonic() - lost)  # a shadow cannot register while etcd is away
        self.memory.etcd_lost_since = news.lost_since
        if news.view is not None:
            was_paused = self.view.paused if self.view is not None else None
            self.view = self.execute.view = news.view
            self.pause_changed(was_paused, news.view.paused)
        return news

    def pause_changed(self, was: dict | None, now: dict | None) -> None:
        """An operator paused failover (said once), or resumed it: then this agent restarts (systemd starts it
        again at once) and reconciles what it finds, so that nothing decided while paused is half remembered
        (control/pause.py)."""
        if now is not None and was is None:
            self.events.write("failover-paused", **{k: now.get(k) for k in ("by", "since", "reason")})
        elif now is None and was is not None:
            self.events.write("failover-resumed", paused_since=was.get("since"))
            self.stopping = True
            os.write(self.wake_w, b"r")

    def take_failure_notices(self) -> None:
        """Other agents' failure notices since the last tick (torn down at once), and what was refused or unsent."""
        notices, refused = self.inbox.take()
        self.node.on_notices(notices)
        for _notice in notices:
            self.metrics.count("notices_taken")
        for who, why in refused:
            self.metrics.count("notices_refused")
            self.execute([ReportFault("notice-refused", None, None, f"{who}: {why}")])
        for peer, why in self.notifier.take_unsent():
            self.metrics.count("notices_unsent")
            self.execute([ReportFault("notice-unsent", None, None, f"{peer}: {why}")])

    def tick_failed(self, err: Exception) -> None:
        self.metrics.count("tick_errors_total")
        text = f"{type(err).__name__}: {err}"
        last_text, last_at = self.last_error
        if text != last_text or time.monotonic() - last_at > ERROR_REPORT_S:
            self.last_error = (text, time.monotonic())
            self.events.write("tick-error", error=text, trace=traceback.format_exc(limit=8))
        time.sleep(TICK_S)  # an error every tick must not spin

    def wait_for_wakeup(self) -> tuple[list[int], bool]:
        """Block until a rank or the GMS server exits, the feed brings news, a probe answers, a torn-down rank's
        cgroup empties, or the tick passes; returns the cohorts whose rank exited, and whether the GMS server did.
        poll(), not select(): descriptor numbers above 1024 are fine."""
        emptying, timeout = self.watch_teardowns()
        fds = {r.pidfd: c for c, r in self.memory.ranks.items() if r.pidfd is not None}
        poller = select.poll()
        for fd in [*fds, self.wake_r] + ([self.gms_pidfd] if self.gms_pidfd is not None else []):
            poller.register(fd, select.POLLIN)
        for fd in emptying:
            poller.register(fd, select.POLLPRI)
        ready = {fd for fd, _events in poller.poll(timeout * 1000)}
        if self.wake_r in ready:
            os.read(self.wake_r, 4096)
        gms_exited = self.gms_pidfd is not None and self.gms_pidfd in ready
        if gms_exited and self.gms_pidfd is not None:
            os.close(self.gms_pidfd)
            self.gms_pidfd = None
        return [fds[fd] for fd in ready if fd in fds], gms_exited

    def watch_teardowns(self) -> tuple[list[int], float]:
        """The cgroup.events descriptors of the ranks being torn down (opened as a teardown starts, closed as it
        ends), each read to arm its next report, and how long the loop may wait (teardown_wait_s). The kernel
        wakes the loop as a cgroup empties: no polling of every host's cgroups while their ranks end, on the
        same CPUs as the processes that end."""
        for cohort in [c for c in self.cgroup_events if c not in self.memory.terminating]:
            os.close(self.cgroup_events.pop(cohort))
        populated: dict[int, bool] = {}
        for cohort, teardown in self.memory.terminating.items():
            if cohort not in self.cgroup_events and teardown.rank.cgroup:
                events = cgroup_events(teardown.rank.cgroup)
                if events is not None:
                    self.cgroup_events[cohort] = events
            if cohort in self.cgroup_events:
                answer = cgroup_populated(self.cgroup_events[cohort])
                if answer is None:  # the cgroup was removed: read the cgroup itself from now on
                    os.close(self.cgroup_events.pop(cohort))
                else:
                    populated[cohort] = answer
        wait = teardown_wait_s(self.memory.terminating, populated, time.monotonic())
        return list(self.cgroup_events.values()), wait

    def healthy(self) -> bool:
        return time.monotonic() - self.last_tick < STALLED_S

    # --- the GMS server -------------------------------------------------------------------------------------
    def track_gms(self) -> None:
        if self.gms_pidfd is not None:
            return
        pid = observe.gms_server_pid(self.plan)  # tried every tick until it runs
        if pid:
            self.gms_pidfd = pidfd_open(pid)

    # --- start: adopt what runs --------------------------------------------------------------------------------
    def adopt(self) -> None:
        """Take over ranks that already run (after an agent restart, or started by the engine role), without
        etcd: their exits are watched from the first tick. Their generations come with the first view
        (node_duties.settle_adopted), the missing slots too (driver_duties.first_view)."""
        for cohort in self.plan.cohort_ids:
            rank = observe.track(self.plan, self.host, cohort, 0)
            if rank is not None:
                self.memory.ranks[cohort] = rank
                if rank.cgroup:
                    self.memory.unit_cgroups[cohort] = rank.cgroup


def teardown_wait_s(terminating: dict[int, Teardown], populated: dict[int, bool], now: float) -> float:
    """How long the loop may wait for a wake-up: TICK_S, since the kernel wakes it as a torn-down rank's cgroup
    empties (``populated``: cohort -> what its cgroup.events says, for those the loop watches); TEARDOWN_TICK_S
    while a teardown is not watched (no cgroup.events: its cgroup is read every tick) or says it is empty already
    (it emptied before the watch was armed: the tick confirms it); never past a teardown's kill_at (a grace's
    end, a SIGKILL again)."""
    wait = TICK_S
    for cohort, teardown in terminating.items():
        if populated.get(cohort) is not True:
            wait = min(wait, TEARDOWN_TICK_S)
        wait = min(wait, max(0.0, teardown.kill_at - now))
    return wait


def single_instance(path: str) -> int:
    """Hold an exclusive lock for the agent's lifetime: two agents on one node cannot both act."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        console.err(f"shadowline-agent: another agent holds {path}; refusing to run a second one")
        raise SystemExit(3) from None
    return fd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shadowline-agent", description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--plan", required=True, help="the cohort plan (JSON), as the agent role writes it")
    parser.add_argument("--host", required=True, help="this node's name in the plan")
    args = parser.parse_args(argv)
    plan = Plan.load(args.plan)
    if args.host not in gpu_hosts(plan):
        parser.error(f"--host {args.host} is neither a node nor a spare of deployment {plan.deployment}")
    _lock = single_instance(plan.agent_lock_path(args.host))
    if args.host in spare_hosts(plan):
        return run_spare(plan, args.host)
    try:  # three clients: the loop's (writes), the feed's (reads), the lease's; each thread its own, one token
        etcd = etcd_for(plan, 2.0, deadline=2.5)
        agent = Agent(plan, args.host, etcd, etcd.sibling(2.0, 3.0), etcd.sibling(2.0, 2.5))
    except MetricsUnavailable as err:
        console.err(err)
        return 2

    def stop(_signum: int, _frame: Any) -> None:
        agent.stopping = True
        os.write(agent.wake_w, b"s")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    own = agent.plan  # its replica's: notices are taken from that replica's nodes only
    serve(own.node(args.host).address, int(own.ports.agent_metrics),
          lambda: (agent.metrics.render(), CONTENT_TYPE), agent.healthy, agent_server_context(own),
          notices=agent.inbox.receive, peers=lambda peer: sender_node(own, peer) is not None,
          peer_idle_s=PEER_IDLE_S, peer_count=len(own.hosts))
    agent.run()
    return 0


def run_spare(plan: Plan, host: str) -> int:
    """A spare's agent (spare_agent.py): its presence, its GMS server's gauges, its metrics endpoint."""
    try:
        spare = SpareAgent(plan, host, etcd_for(plan, 2.0, deadline=2.5))
    except MetricsUnavailable as err:
        console.err(err)
        return 2

    def stop(_signum: int, _frame: Any) -> None:
        spare.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    serve(plan.gpu_node(host).address, int(plan.ports.agent_metrics),
          lambda: (spare.metrics.render(), CONTENT_TYPE), spare.healthy, agent_server_context(plan))
    spare.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
