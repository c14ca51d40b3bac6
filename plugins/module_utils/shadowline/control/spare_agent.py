"""A spare node's agent (gms_spares; docs/fleet.md, Spare nodes): the agent of a host that runs a GMS server of
the deployment's model and holds no rank.

It keeps its presence in etcd (``agents/<host>`` on its lease, ``role: spare``: presence.py), so that the fleet's
drivers and status see a spare that is there; it watches its GMS server's unit and its model status, and exports
them with ``shadowline_agent_spare_ready`` (1 while the GMS server is up, the model is Ready where shadowline
stages it, and the presence is held) for the pool's alert (ShadowlineSparesBelowMinimum). It starts and stops
nothing: relocation onto a spare (issue #40's membership epochs) is the replica's driver's, and is not built yet.

Its loop, top to bottom: every SYNC_S it reads its GMS server's unit, shows the gauges and tells systemd's
watchdog it is alive; SIGTERM ends it.
"""

from __future__ import annotations

import os
import threading
import time

from ..common.coordination import Keys, agent_instance
from ..common.etcd_client import Etcd
from ..common.events import EventLog
from ..common.systemd_notify import SystemdNotifier
from ..deployment.plan import Plan, spare_hosts
from .agent_metrics import AgentMetrics
from .observe import gms_server_pid
from .presence import SPARE, Presence

SYNC_S = 1.0  # how often it looks at its GMS server and shows its gauges
STALLED_S = 5.0  # its metrics port's /health answers 503 when the loop has not ticked for this long


class SpareAgent:
    def __init__(self, plan: Plan, host: str, lease_etcd: Etcd) -> None:
        if host not in spare_hosts(plan):
            raise KeyError(f"{host} is not a spare of deployment {plan.deployment}")
        self.plan = plan
        self.host = host
        self.events = EventLog(plan.events_path, host, deployment=plan.deployment)
        self.metrics = AgentMetrics(plan.deployment, host, (), model_dir=plan.model_dir, spare=True,
                                    spares_wanted=plan.failover.min_spares)
        self.stop = threading.Event()
        self.presence = Presence(lease_etcd, Keys(plan.deployment, None).agent(host),
                                 int(plan.failover.agent_lease_ttl_s), agent_instance(os.getpid(), time.time_ns()),
                                 self.events.write, self.stop, role=SPARE)
        self.systemd = SystemdNotifier()
        self.last_tick = time.monotonic()

    def run(self) -> None:
        self.presence.start()
        self.events.write("agent-started", pid=os.getpid(), spare=True)
        self.systemd.ready("spare: a GMS server, no rank")
        while not self.stop.is_set():
            gms_up = gms_server_pid(self.plan) is not None
            model_ready = self.metrics.show_node(gms_server_up=gms_up)
            self.metrics.show_spare(ready=gms_up and model_ready is not False and self.presence.lease != 0)
            self.last_tick = time.monotonic()
            self.systemd.alive()
            self.stop.wait(SYNC_S)
        self.systemd.stopping()
        self.events.write("agent-stopped")

    def healthy(self) -> bool:
        return time.monotonic() - self.last_tick < STALLED_S
