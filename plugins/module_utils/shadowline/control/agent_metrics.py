"""The agent's own Prometheus metrics, through ``prometheus_client`` (the engines' runtime, where the agent runs):
counters of what it did, the durations of a failover's phases as histograms, and gauges of what it sees.

Every series has the labels ``deployment`` and ``node`` (this agent's) and lives in a registry of its own, not
the process's global one. The names are the ones the alert rules (roles/monitoring/files/rules/) and the
dashboard (roles/monitoring/files/grafana/) are written against; docs/monitoring.md lists them.

This module is also part of the Ansible collection's module_utils, which Ansible's sanity test imports without
third-party packages: ``prometheus_client`` is imported when present, and ``AgentMetrics`` refuses to be built
without it (``MetricsUnavailable``: the agent says so when it starts). No Ansible module imports this module.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..common.coordination import DEAD, FAILED, LAUNCHING, RUNNING
from ..common.policy import CANARY_UNANSWERED, GENERATION_STALLED, GPU_FAULT, GPU_XID, LEADER_HUNG
from ..model.spec import status_path_for
from ..model.status import READY, read_status
from .view import DeploymentView

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
except ImportError:  # Ansible's sanity import test; the agent's runtime has it (requirements/runtime.lock)
    prometheus_client = None  # pylint: disable=invalid-name

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the text exposition format generate_latest writes
PREFIX = "shadowline_agent_"
SLOT_STATES = (LAUNCHING, RUNNING, FAILED, DEAD)
# Reasons a failure is declared for (node_duties.py, driver_duties.py, policy.py), exported at 0 from the start
# so that Prometheus's increase() sees the first detection; another reason gets its series when it happens.
DETECTION_REASONS = ("rank-exited", "rank-missing", "launch-failed", "launch-timeout", LEADER_HUNG,
                     GENERATION_STALLED, CANARY_UNANSWERED, GPU_XID, GPU_FAULT, "node-lost", "wake-timeout",
                     "gms-republish")
# A failover's phases take from about 10 ms (a teardown) to tens of seconds (a relaunch that loads weights).
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)

COUNTERS = {  # name (prometheus_client adds "_total") -> help
    "detections": "Failures this agent declared, by reason.",
    "teardowns": "Generations whose ranks this agent removed from its node.",
    "promotions": "Promotions this agent (the driver) verified: the lock holder changed and serves.",
    "promotions_unverified": "Failures after which this agent (the driver) saw no new lock holder serving in time.",
    "relaunches": "Ranks of a new generation this agent started on its node.",
    "slots_dead": "Slots this agent (the driver) gave up after a crash loop.",
    "agents_lost": "Other nodes' agents whose etcd lease this agent (the driver) saw expire.",
    "records_invalid": "Records in etcd this agent could not read and ignored (reported once per revision).",
    "tick_errors": "Errors that ended one pass of this agent's loop (reported; the loop went on).",
    "notices_taken": "Failure notices from other nodes' agents this agent took (it tore down its rank of that "
                     "generation, if it ran one).",
    "notices_refused": "Failure notices this agent refused: not from a node of the deployment, about another node, "
                       "malformed or too old.",
    "notices_unsent": "Failure notices this agent could not deliver to another node's agent (etcd carried the "
                      "declaration alone).",
}
HISTOGRAMS = {  # name -> help
    "teardown_seconds": "Seconds from a failure's detection to its generation's ranks gone on every node (driver).",
    "promotion_seconds": "Seconds from a failure's detection to the new lock holder serving (driver).",
    "relaunch_seconds": "Seconds from a failure's detection to the new generation's rank running on this node.",
}
GAUGES = {  # name -> (help, labels besides deployment and node)
    "slot_state": ("Each cohort's slot as this agent last read it from etcd, one-hot over launching, running, "
                   "failed, dead.", ("cohort", "state")),
    "active_cohort": ("The cohort recorded as serving in etcd, -1 when none.", ()),
    "parked_shadows": ("Cohorts whose slot is running and that are not the active one: shadows parked.", ()),
    "driver": ("1 on the driver node (node rank 0: verifies promotions, relaunches slots), else 0.", ()),
    "gms_server_up": ("1 while this node's GMS server unit is active with a main process, else 0.", ()),
    "model_ready": ("1 when this node's model status file says Ready (staged and verified), else 0; no series "
                    "when shadowline does not stage the model.", ()),
    "model_info": ("1, with the manifest digest of the model this node holds Ready.", ("digest",)),
    "spare": ("1 on a spare node (gms_spares: a GMS server and no rank), else 0.", ()),
    "spare_ready": ("1 on a spare whose GMS server is up, whose model is Ready (where shadowline stages it) and "
                    "whose presence in etcd is held, else 0; no series on a node.", ()),
    "spares_wanted": ("gms_failover.min_spares: the spares the deployment wants ready at least.", ()),
}


class MetricsUnavailable(RuntimeError):
    """prometheus_client is not importable: the agent runs from an interpreter without the runtime."""


class AgentMetrics:
    """The agent's registry. The loop and the executor call ``count``, ``observe``, ``show_view`` and
    ``show_node``; the HTTP server calls ``render``. prometheus_client's metrics are thread-safe."""

    def __init__(self, deployment: str, node: str, cohorts: Iterable[int] = (), *, driver: bool = False,  # noqa: PLR0913 (keyword-only settings)
                 model_dir: str = "", spare: bool = False, spares_wanted: int = 0) -> None:
        if prometheus_client is None:
            raise MetricsUnavailable(
                "shadowline-agent: prometheus_client is not importable; run the agent with the engines' runtime "
                "(the plan's `python`, which requirements/runtime.lock installs it into)")
        # no *_created series: the dashboard and rules use none (prometheus_client before 0.17, Debian 12's package
        # that a container-mode host's agent imports, reads only the environment variable)
        if hasattr(prometheus_client, "disable_created_metrics"):
            prometheus_client.disable_created_metrics()
        else:
            os.environ["PROMETHEUS_DISABLE_CREATED_SERIES"] = "True"
        self.registry = CollectorRegistry(auto_describe=True)
        self.constant = {"deployment": deployment, "node": node}
        self.cohorts = tuple(cohorts)
        self.model_status_path = status_path_for(model_dir) if model_dir else ""
        self.model_digest: str | None = None  # the digest model_info shows
        base = ("deployment", "node")
        self.counters = {name: Counter(PREFIX + name, text, base + (("reason",) if name == "detections" else ()),
                                       registry=self.registry) for name, text in COUNTERS.items()}
        self.histograms = {name: Histogram(PREFIX + name, text, base, buckets=BUCKETS, registry=self.registry)
                           for name, text in HISTOGRAMS.items()}
        self.gauges = {name: Gauge(PREFIX + name, text, base + extra, registry=self.registry)
                       for name, (text, extra) in GAUGES.items()}
        for name, counter in self.counters.items():  # every series exists from the start, at 0
            if name == "detections":
                for reason in DETECTION_REASONS:
                    counter.labels(**self.constant, reason=reason)
            else:
                counter.labels(**self.constant)
        for histogram in self.histograms.values():
            histogram.labels(**self.constant)
        self.gauges["driver"].labels(**self.constant).set(1 if driver else 0)
        self.gauges["spare"].labels(**self.constant).set(1 if spare else 0)
        self.gauges["spares_wanted"].labels(**self.constant).set(spares_wanted)
        if spare:
            self.gauges["spare_ready"].labels(**self.constant).set(0)
        self.gauges["active_cohort"].labels(**self.constant).set(-1)
        self.gauges["parked_shadows"].labels(**self.constant).set(0)
        for cohort in cohorts:
            for state in SLOT_STATES:
                self.gauges["slot_state"].labels(**self.constant, cohort=str(cohort), state=state).set(0)

    # --- what the agent did --------------------------------------------------------------------------------------
    def count(self, name: str, reason: str = "") -> None:
        """Add one to counter ``name`` (a key of COUNTERS, with or without ``_total``); ``reason`` for detections."""
        name = name[:-len("_total")] if name.endswith("_total") else name
        labels = dict(self.constant, reason=reason) if name == "detections" else self.constant
        self.counters[name].labels(**labels).inc()

    def observe(self, name: str, seconds: float) -> None:
        self.histograms[name].labels(**self.constant).observe(max(0.0, seconds))

    # --- what it sees ----------------------------------------------------------------------------------------------
    def show_view(self, view: DeploymentView) -> None:
        """The gauges of the deployment's state, from the view the agent read from etcd this tick."""
        slot_state = self.gauges["slot_state"]
        for cohort in sorted(set(self.cohorts) | set(view.slots)):
            slot = view.slot(cohort)
            for state in SLOT_STATES:
                on = slot is not None and slot.state == state
                slot_state.labels(**self.constant, cohort=str(cohort), state=state).set(1 if on else 0)
        active = view.active.cohort if view.active is not None else None
        self.gauges["active_cohort"].labels(**self.constant).set(-1 if active is None else active)
        parked = sum(1 for c, e in view.slots.items() if e.slot.state == RUNNING and c != active)
        self.gauges["parked_shadows"].labels(**self.constant).set(parked)

    def show_node(self, gms_server_up: bool) -> bool | None:
        """The gauges of this node: its GMS server, and its model status file (read here, a small JSON file).
        Returns whether the model is Ready, None when there is no status file (shadowline does not stage it)."""
        self.gauges["gms_server_up"].labels(**self.constant).set(1 if gms_server_up else 0)
        status = read_status(self.model_status_path) if self.model_status_path else None
        if status is None:
            return None
        ready = status.state == READY and bool(status.digest)
        self.gauges["model_ready"].labels(**self.constant).set(1 if ready else 0)
        digest = str(status.digest) if ready else None
        if digest != self.model_digest:  # one digest at a time: the one held now
            info = self.gauges["model_info"]
            if self.model_digest is not None:
                info.remove(*self.constant.values(), self.model_digest)
            if digest is not None:
                info.labels(**self.constant, digest=digest).set(1)
            self.model_digest = digest
        return ready

    def show_spare(self, ready: bool) -> None:
        """A spare's readiness to take a rank (spare_agent.py)."""
        self.gauges["spare_ready"].labels(**self.constant).set(1 if ready else 0)

    # --- the exposition --------------------------------------------------------------------------------------------
    def render(self) -> bytes:
        """The text exposition format (``CONTENT_TYPE``), label values escaped by prometheus_client."""
        return prometheus_client.generate_latest(self.registry)
