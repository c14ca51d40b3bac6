"""shadowline-agent: one per node; detects failures of the cohorts' ranks, tears a failed generation down on
every node at once, verifies the promotion and relaunches a fresh shadow.

Run as ``python -m shadowline.control.agent --plan /etc/shadowline/<deployment>/plan.json --host <node>``.

Each agent owns its node's ranks (the engine units ``shadowline-<deployment>-engine@<cohort>``): it watches
their main processes through pidfds (an exit is known at once), their leaders' /health, and their progress
signal (the backend's, e.g. the stand-in's collective heartbeat). Agents agree through the deployment's etcd
(coordination.py): a failure is declared with one compare-and-swap, every agent kills its ranks of that
generation and confirms, and the agent on the leader node (the driver, where every cohort's leader and the
failover lock live) verifies the promotion and relaunches the slot once the old ranks are gone on every node,
with growing delays on a crash loop.

The loop below is the whole agent, top to bottom. Each tick it reads one view of the deployment (view.py: one
range read of its etcd prefix) when something changed or a period is due, and hands it with the clock to the
node's duties (node_duties.py) and, on node rank 0, the driver's (driver_duties.py): pure decisions that return
actions, performed by the executor (executor.py).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import queue
import select
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .. import console
from ..deployment.plan import Plan
from . import observe
from .agent_metrics import CONTENT_TYPE, AgentMetrics, MetricsUnavailable
from .coordination import LAUNCHING, RUNNING, Coordination, Slot
from .driver_duties import DriverDuties
from .etcd_client import Etcd, EtcdError, Event
from .events import EventLog
from .executor import Executor, Schedule
from .memory import DriverMemory, NodeMemory
from .node_duties import NodeDuties
from .proc import pidfd_open, unit_properties
from .view import DeploymentView, Now, read_view

TICK_S = 0.05  # how often the loop looks at the lock and the teardowns when nothing wakes it
CHECK_S = 0.2  # how often it asks leaders' /health and (driver) drives
SYNC_S = 1.0  # how often it reconciles with the slots even without a watch event


class Agent:
    def __init__(self, plan: Plan, host: str, etcd: Etcd) -> None:
        self.plan = plan
        self.host = host
        self.etcd = etcd
        self.coord = Coordination(etcd, plan.deployment)
        self.is_driver = plan.node(host).rank == 0
        self.events = EventLog(plan.events_path, host, deployment=plan.deployment)
        self.metrics = AgentMetrics(plan.deployment, host, plan.cohort_ids, driver=self.is_driver,
                                    model_dir=plan.model_dir)
        self.schedule = Schedule()
        self.memory = NodeMemory()
        self.driver_memory = DriverMemory() if self.is_driver else None
        self.wake_r, self.wake_w = os.pipe()
        self.execute = Executor(plan, host, etcd, self.events, self.metrics, self.memory, self.driver_memory,
                                self.schedule, self.wake_w)
        self.node = NodeDuties(plan, host, self.memory, self.execute)
        self.driver = DriverDuties(plan, host, self.memory, self.driver_memory, self.execute.registrations,
                                   self.execute) if self.driver_memory is not None else None
        self.gms_pidfd: int | None = None
        self.lease = 0
        self.revision = 0  # the etcd revision the watch continues from
        self.next_keepalive = 0.0
        self.stopping = False
        self.changes: queue.Queue[list[Event]] = queue.Queue()

    # --- the loop ------------------------------------------------------------------------------------------
    def run(self) -> None:
        self.register()
        self.adopt()
        threading.Thread(target=self.watch_loop, name="etcd-watch", daemon=True).start()
        self.events.write("agent-started", pid=os.getpid(), driver=self.is_driver,
                          adopted={c: r.pid for c, r in self.memory.ranks.items()})
        while not self.stopping:
            exited, gms_exited = self.wait_for_wakeup(TICK_S)
            now = Now.read()
            for cohort in exited:
                self.node.on_rank_exit(cohort, now)
            if gms_exited:
                self.node.on_gms_exit(now)
            if self.execute.take_probe_results():
                self.schedule.next_check = 0.0  # a promotion's completion answered: verify at once
            if self.memory.starting:
                self.node.track_starts(now)
            if self.memory.terminating:
                self.node.finish_teardowns(now)
            slots, changed = self.drain_changes()
            self.node.on_slot_changes(slots)  # the hot path: a declared failure torn down from the event itself
            holder = self.driver.holder() if self.driver else None
            sync = changed or now.mono >= self.schedule.next_sync
            check = changed or now.mono >= self.schedule.next_check
            new_holder = self.driver_memory is not None and holder != self.driver_memory.holder
            view = self.read_view() if sync or new_holder or (check and self.driver) else None
            if sync:
                self.schedule.next_sync = now.mono + SYNC_S
                if view is not None:
                    self.node.reconcile(view, now)
                    self.metrics.show_view(view)
                self.metrics.show_node(gms_server_up=self.gms_pidfd is not None)
            if check:
                promoting = self.driver_memory is not None and self.driver_memory.promotion is not None
                self.schedule.next_check = now.mono + (TICK_S if promoting else CHECK_S)  # verify it closely
                self.track_gms()
                self.node.check_health()
            if self.driver is not None:
                self.driver.watch_lock(holder, view, now)
                if check and view is not None:
                    self.driver.drive(view, Now.read())
            self.keepalive(Now.read())
        self.events.write("agent-stopped")

    def wait_for_wakeup(self, timeout: float) -> tuple[list[int], bool]:
        """Block until a rank or the GMS server exits, etcd changes, a probe answers, or the tick passes;
        returns the cohorts whose rank exited, and whether the GMS server did."""
        fds = {r.pidfd: c for c, r in self.memory.ranks.items() if r.pidfd is not None}
        gms = [self.gms_pidfd] if self.gms_pidfd is not None else []
        readable, _unused1, _unused2 = select.select(list(fds) + gms + [self.wake_r], [], [], timeout)
        if self.wake_r in readable:
            os.read(self.wake_r, 4096)
        gms_exited = bool(gms) and gms[0] in readable
        if gms_exited and self.gms_pidfd is not None:
            os.close(self.gms_pidfd)
            self.gms_pidfd = None
        return [fds[fd] for fd in readable if fd in fds], gms_exited

    def read_view(self) -> DeploymentView | None:
        try:
            return read_view(self.etcd, self.coord.keys)
        except EtcdError:
            return None

    def drain_changes(self) -> tuple[list[Slot], bool]:
        """The slot records the watch delivered since the last tick, and whether anything changed at all."""
        prefix = self.coord.keys.slots()
        slots: list[Slot] = []
        changed = False
        while not self.changes.empty():
            for change in self.changes.get_nowait():
                changed = True
                if change.type == "put" and change.key.startswith(prefix):
                    slots.append(Slot(**json.loads(change.value)))
        return slots, changed

    # --- the GMS server -------------------------------------------------------------------------------------
    def track_gms(self) -> None:
        if self.gms_pidfd is not None:
            return
        props = unit_properties(self.plan.unit_name("gms"), "MainPID", "ActiveState")
        pid = int(props.get("MainPID", "0") or 0)
        if props.get("ActiveState") == "active" and pid:
            self.gms_pidfd = pidfd_open(pid)

    # --- membership ---------------------------------------------------------------------------------------------
    def register(self) -> None:
        self.lease = self.etcd.lease_grant(int(self.plan.failover.agent_lease_ttl_s))
        self.revision = self.etcd.put(self.coord.keys.agent(self.host),
                                      json.dumps({"pid": os.getpid(), "since": time.time()}), lease=self.lease)

    def keepalive(self, now: Now) -> None:
        if now.mono < self.next_keepalive:
            return
        self.next_keepalive = now.mono + max(0.2, self.plan.failover.agent_lease_ttl_s / 3)
        try:
            if self.etcd.lease_keepalive(self.lease) <= 0:
                self.events.write("agent-lease-expired")
                self.register()
        except EtcdError as err:
            if self.memory.etcd_lost_since is None:
                self.memory.etcd_lost_since = now.mono
                self.events.write("etcd-unreachable", error=str(err))
            return
        if self.memory.etcd_lost_since is not None:
            self.events.write("etcd-reachable", after_s=round(now.mono - self.memory.etcd_lost_since, 3))
            self.memory.etcd_lost_since = None

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

    # --- start: adopt what runs --------------------------------------------------------------------------------
    def adopt(self) -> None:
        """Take over ranks that already run (after an agent restart, or started by the engine role)."""
        view = read_view(self.etcd, self.coord.keys)
        if self.driver_memory is not None:
            self.driver_memory.serving = view.active.cohort if view.active else None
        now = Now.read()
        for cohort in self.plan.cohort_ids:
            slot = view.slot(cohort)
            rank = observe.track(self.plan, self.host, cohort, slot.generation if slot else 1)
            if rank is None:
                continue
            self.memory.ranks[cohort] = rank
            if slot is not None and slot.state == RUNNING:  # it was healthy before this agent started
                rank.healthy_at = now.mono
            if self.is_driver and slot is None:
                self.coord.create_slot(Slot(cohort=cohort, generation=rank.generation, state=RUNNING))
        if self.is_driver:
            for cohort in self.plan.cohort_ids:  # slots whose ranks do not run: launch them
                if cohort not in self.memory.ranks and view.slot(cohort) is None:
                    self.coord.create_slot(Slot(cohort=cohort, generation=1, state=LAUNCHING, reason="not running"))


# --- the metrics endpoint and the command line -----------------------------------------------------------------
def serve_metrics(agent: Agent, address: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            if self.path not in ("/metrics", "/health"):
                self.send_error(404)
                return
            body = agent.metrics.render() if self.path == "/metrics" else b"ok\n"
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
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
        console.err(f"shadowline-agent: another agent holds {path}; refusing to run a second one")
        raise SystemExit(3) from None
    return fd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shadowline-agent", description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--plan", required=True, help="the cohort plan (JSON), as the agent role writes it")
    parser.add_argument("--host", required=True, help="this node's name in the plan")
    args = parser.parse_args(argv)
    plan = Plan.load(args.plan)
    if args.host not in plan.hosts:
        parser.error(f"--host {args.host} is not a node of deployment {plan.deployment}")
    _lock = single_instance(plan.agent_lock_path(args.host))
    try:
        agent = Agent(plan, args.host, Etcd(plan.infra.etcd_endpoints))
    except MetricsUnavailable as err:
        console.err(err)
        return 2

    def stop(_signum: int, _frame: Any) -> None:
        agent.stopping = True
        os.write(agent.wake_w, b"s")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    serve_metrics(agent, plan.node(args.host).address, int(plan.ports.agent_metrics))
    agent.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
