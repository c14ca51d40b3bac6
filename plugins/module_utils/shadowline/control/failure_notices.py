"""Failure notices: an agent that declares a generation failed also tells the other nodes' agents directly, beside
etcd, so that their ranks of it are killed without waiting for the declaration's raft write and watch.

etcd stays the record and the authority: the declaration is written there as before, the driver promotes and
relaunches from etcd only, and a notice that is lost, late or refused changes nothing but how soon a node's rank
is killed (from the etcd watch event then, as without notices). A notice only ever tears down a rank of the very
generation it names, on a node whose rank runs that generation: what the declaration in etcd does too, a little
later. A generation once failed never runs again, so a notice replayed later finds nothing to kill; one older than
``MAX_AGE_S`` is refused anyway (a deployment whose etcd was wiped counts generations from 1 again).

Transport: ``POST /notice`` on the other agent's endpoint (``gms_ports.agent_metrics``, control/metrics_server.py),
which the host firewall opens to the deployment's hosts only. Over TLS with client certificates (the default)
a notice is taken only from a client certificate naming one of the deployment's nodes (``<node>.<deployment>
.shadowline``), and only about that node: Prometheus's, the controller's or an infra host's certificate is
refused. With ``gms_insecure: true`` the endpoint is plain HTTP and a notice is taken from a node's address; like
etcd then, whoever can send from there can tear a cohort down.

Each peer has a sender thread with a connection kept open and warm (a request every ``WARM_S``; the endpoint keeps
a node's connection open ``PEER_IDLE_S``), so a notice is one request on an open TLS connection, not a handshake.
The loop only queues it. Stdlib only (the agent runs outside Ansible).
"""

from __future__ import annotations

import http.client
import json
import queue
import ssl
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..cluster.access import agent_client_context, agent_url
from ..common.coordination import FAILED, Slot, is_finite, is_int
from ..common.http import KeptConnections
from ..common.wakeup import drain, wake
from ..deployment.pki import common_name
from ..deployment.plan import Plan
from .metrics_server import NOTICE_PATH, Peer

MAX_AGE_S = 10.0  # a notice this much older (or newer: clocks) than the receiver's clock is refused
SEND_TIMEOUT_S = 1.0  # a notice not answered by then is left to etcd
WARM_S = 20.0  # each sender asks its peer's /health this often, keeping its connection open and handshaken
RETRY_S = 2.0  # after a failed warm-up (the peer's agent not up yet): try again this soon
PEER_IDLE_S = 60.0  # the endpoint keeps a node's connection open this long without a request (others: 5 s)
EVIDENCE_TEXT = 400  # a text of the declaration's evidence is sent cut to this many characters (the body's limit)
EVIDENCE_FIELDS = 16
SCHEMA = 1


class NoticeRefused(ValueError):
    """A notice the receiving agent does not act on, and why (said to the sender as a 4xx)."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


@dataclass(frozen=True)
class FailureNotice:
    """A generation declared failed, as the declaring agent tells the others."""
    deployment: str
    cohort: int
    generation: int
    reason: str
    host: str  # the declaring node
    since: float  # wall clock, when it declared
    # what the declaration names (Declare.evidence: the signal, the culprit node and rank, what was seen), so that
    # a node that has to write the declaration for it (node_duties.declare_missing) writes the same one
    evidence: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> bytes:
        evidence = {k: v[:EVIDENCE_TEXT] if isinstance(v, str) else v for k, v in self.evidence.items()}
        return json.dumps({"schema": SCHEMA, **asdict(self), "evidence": evidence}, sort_keys=True).encode()

    def slot(self) -> Slot:
        """The failed slot record the declaration writes to etcd, as far as a teardown needs it."""
        return Slot(cohort=self.cohort, generation=self.generation, state=FAILED, reason=self.reason,
                    since=self.since, detected_by=self.host)

    @classmethod
    def parse(cls, body: bytes) -> FailureNotice:
        """The notice, or NoticeRefused (400) naming what is wrong with it."""
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as err:
            raise NoticeRefused(400, f"not JSON ({err})") from None
        if not isinstance(data, dict) or data.pop("schema", None) != SCHEMA:
            raise NoticeRefused(400, f"not a failure notice of schema {SCHEMA}")
        names = {"deployment", "cohort", "generation", "reason", "host", "since", "evidence"}
        if set(data) != names:
            raise NoticeRefused(400, f"fields {sorted(data)}, not {sorted(names)}")
        for name in ("cohort", "generation"):
            value = data[name]
            if not is_int(value) or value < (1 if name == "generation" else 0):
                raise NoticeRefused(400, f"{name} is {value!r}, not a whole number in range")
        for name in ("deployment", "reason", "host"):
            if not isinstance(data[name], str) or not 0 < len(data[name]) <= 200:
                raise NoticeRefused(400, f"{name} is not a short text")
        if not is_finite(data["since"]):
            raise NoticeRefused(400, f"since is {data['since']!r}, not a time")
        if not evidence_ok(data["evidence"]):
            raise NoticeRefused(400, f"evidence is not an object of at most {EVIDENCE_FIELDS} short named texts "
                                     f"or numbers")
        return cls(**data)


def evidence_ok(evidence: Any) -> bool:
    """A declaration's evidence as a notice may carry it: named short texts, finite numbers, booleans, nulls."""
    if not isinstance(evidence, dict) or len(evidence) > EVIDENCE_FIELDS:
        return False
    for name, value in evidence.items():
        if not 0 < len(name) <= 40:
            return False
        if isinstance(value, str):
            if len(value) > EVIDENCE_TEXT:
                return False
        elif not (value is None or isinstance(value, bool) or is_finite(value)):
            return False
    return True


def sender_node(plan: Plan, peer: Peer) -> str | None:
    """The deployment's node that ``peer`` is: by its client certificate's common name over TLS, by its address
    over plain HTTP (gms_insecure); None when it is no node of the deployment (monitoring, the controller, an
    infra host that runs no engine, anyone else)."""
    for node in plan.nodes:
        if plan.secure:
            if peer.common_name == common_name(plan.deployment, node.host):
                return node.host
        elif peer.address == node.address:
            return node.host
    return None


def accept(plan: Plan, body: bytes, peer: Peer, now: float) -> FailureNotice:
    """The notice in ``body`` if the agent may act on it, else NoticeRefused saying why: it must come from a
    node of this deployment, about a declaration of that node, of this deployment, and be recent."""
    sender = sender_node(plan, peer)
    if sender is None:
        raise NoticeRefused(403, f"{peer.common_name or peer.address} is not a node of deployment {plan.deployment}")
    notice = FailureNotice.parse(body)
    if notice.deployment != plan.deployment or notice.host != sender:
        raise NoticeRefused(403, f"a notice from {sender} names deployment {notice.deployment!r} and node "
                                 f"{notice.host!r}")
    if abs(now - notice.since) > MAX_AGE_S:
        raise NoticeRefused(409, f"declared {now - notice.since:.1f} s ago, over {MAX_AGE_S:.0f} s")
    return notice


class Inbox:
    """The notices the agent's endpoint took (its threads put them here), for the loop to take each tick."""

    def __init__(self, plan: Plan, wake_fd: int) -> None:
        self.plan = plan
        self.wake_fd = wake_fd
        self.notices: queue.Queue[FailureNotice] = queue.Queue()
        self.refused: queue.Queue[tuple[str, str]] = queue.Queue()  # (who, why)

    def receive(self, body: bytes, peer: Peer) -> tuple[int, str]:
        """Called by the endpoint's request thread: (HTTP status, text) for the sender."""
        try:
            notice = accept(self.plan, body, peer, time.time())
        except NoticeRefused as err:
            self.refused.put((peer.common_name or peer.address, str(err)))
            self.wake()
            return err.status, str(err)
        self.notices.put(notice)
        self.wake()
        return 202, "taken"

    def take(self) -> tuple[list[FailureNotice], list[tuple[str, str]]]:
        return drain(self.notices), drain(self.refused)

    def wake(self) -> None:
        wake(self.wake_fd, b"n")


class Notifier:
    """Sends each failure notice to every other node's agent, from a thread per peer (the loop never waits)."""

    def __init__(self, plan: Plan, host: str, wake_fd: int) -> None:
        context = agent_client_context(plan)
        self.links = [PeerLink(peer, agent_url(plan, peer), context, self) for peer in plan.hosts if peer != host]
        self.wake_fd = wake_fd
        self.unsent: queue.Queue[tuple[str, str]] = queue.Queue()  # (peer, why), for the event log
        self.stop = threading.Event()

    def start(self) -> None:
        for link in self.links:
            threading.Thread(target=link.run, name=f"notice-{link.peer}", daemon=True).start()

    def send(self, notice: FailureNotice) -> None:
        for link in self.links:
            link.queue.put(notice)

    def take_unsent(self) -> list[tuple[str, str]]:
        return drain(self.unsent)

    def failed(self, peer: str, why: str) -> None:
        self.unsent.put((peer, why))
        wake(self.wake_fd, b"n")


class PeerLink:
    """One peer's sender: a kept connection, warmed every WARM_S, and the notices queued for it."""

    def __init__(self, peer: str, origin: str, context: ssl.SSLContext | None, notifier: Notifier) -> None:
        self.peer = peer
        self.origin = origin
        self.connections = KeptConnections(context)
        self.notifier = notifier
        self.queue: queue.Queue[FailureNotice] = queue.Queue()

    def run(self) -> None:
        wait = 0.0
        while not self.notifier.stop.is_set():
            try:
                notice = self.queue.get(timeout=wait)
            except queue.Empty:
                wait = WARM_S if self.warm() else RETRY_S
                continue
            self.deliver(notice)

    def warm(self) -> bool:
        try:
            self.connections.request("GET", self.origin, "/health", None, {}, SEND_TIMEOUT_S)
        except (OSError, http.client.HTTPException):
            return False
        return True

    def deliver(self, notice: FailureNotice) -> None:
        try:
            status, body = self.connections.request("POST", self.origin, NOTICE_PATH, notice.to_json(),
                                                    {"Content-Type": "application/json"}, SEND_TIMEOUT_S)
        except (OSError, http.client.HTTPException) as err:
            self.notifier.failed(self.peer, f"cohort {notice.cohort} generation {notice.generation}: {err}")
            return
        if status != 202:
            self.notifier.failed(self.peer, f"cohort {notice.cohort} generation {notice.generation}: HTTP {status} "
                                            f"{body.decode('utf-8', 'replace')[:200]}")
