"""Failure notices (control/failure_notices.py): what an agent takes from another node's agent, and what it tears
down for it; a notice sent by one node's Notifier over the deployment's TLS reaches another node's endpoint, and
the controller's certificate, a certificate without the deployment's CA and a node speaking for another are
refused."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import time
from pathlib import Path

import pytest

from shadowline.cluster.access import agent_server_context, client_context
from shadowline.common.coordination import RUNNING
from shadowline.common.events import EventLog
from shadowline.common.http import KeptConnections
from shadowline.control import metrics_server
from shadowline.control.actions import Declare, NoteDetected, NoteFailure, Record, TearDown, WakeAt
from shadowline.control.failure_notices import (
    EVIDENCE_TEXT,
    MAX_AGE_S,
    PEER_IDLE_S,
    FailureNotice,
    Inbox,
    NoticeRefused,
    Notifier,
    accept,
    sender_node,
)
from shadowline.control.memory import KnownFailure
from shadowline.control.metrics_server import Peer
from shadowline.control.node_duties import RELAY_AFTER_S, launch_due, notice_failed
from shadowline.control.view import DeploymentView, SlotEntry
from shadowline.deployment.pki import common_name, ensure_pki
from shadowline.deployment.plan import Plan

from .test_agent_node import FAILOVER, NOW, at, kinds, memory, rank, slot
from .test_executor_order import node_executor
from .test_plan import plan_for

ADDRESSES = {"node0": "127.0.0.1", "node1": "127.0.0.2"}


def local_plan(secrets: str = "/nonexistent", port: int = 8480, insecure: bool = False) -> Plan:
    """A two-node plan (deployment "llama") on loopback addresses, its agent port ``port``, this host's secrets in
    ``secrets``."""
    data = plan_for(2, gms_engine={"tensor_parallel_size": 16}).to_dict()
    data["nodes"] = [{**n, "address": ADDRESSES[n["host"]]} for n in data["nodes"]]
    data["ports"]["agent_metrics"] = port
    data["security"] = {**data["security"], "dir": secrets, "insecure": insecure}
    return Plan.from_dict(data)


def notice(**override) -> FailureNotice:
    fields = {"deployment": "llama", "cohort": 1, "generation": 3, "reason": "rank-exited", "host": "node1",
              "since": time.time(), "evidence": {"signal": "process-exit", "culprit_node": "node1", "culprit_rank": 1,
                                                 "evidence": "main process 4242 of gms-llama-engine@1 exited",
                                                 "still_s": 1.5, "gpu": None}}
    return FailureNotice(**{**fields, **override})


NODE1 = Peer("127.0.0.2", common_name("llama", "node1"))


# --- what is taken -----------------------------------------------------------------------------------------------
def test_a_recent_notice_of_a_node_about_itself_is_taken_with_the_declarations_evidence():
    sent = notice()
    taken = accept(local_plan(), sent.to_json(), NODE1, time.time())
    assert taken == sent and taken.evidence == sent.evidence


def test_a_long_text_of_the_evidence_is_sent_cut_to_what_a_notice_may_carry():
    long = notice(evidence={"evidence": "x" * 5000})
    taken = accept(local_plan(), long.to_json(), NODE1, time.time())
    assert taken.evidence == {"evidence": "x" * EVIDENCE_TEXT}


@pytest.mark.parametrize(("peer", "override", "status", "words"), [
    (Peer("127.0.0.9", common_name("llama", "controller")), {}, 403, "not a node"),
    (Peer("127.0.0.1", common_name("llama", "prometheus")), {}, 403, "not a node"),
    (Peer("127.0.0.2", common_name("another", "node1")), {}, 403, "not a node"),
    (NODE1, {"host": "node0"}, 403, "names deployment"),
    (NODE1, {"deployment": "another"}, 403, "names deployment"),
    (NODE1, {"since_from_now": -MAX_AGE_S - 5}, 409, "ago"),
    (NODE1, {"since_from_now": MAX_AGE_S + 5}, 409, "ago"),
])
def test_a_notice_from_someone_else_or_about_another_node_or_old_is_refused(peer, override, status, words):
    if "since_from_now" in override:  # from the test's own clock: a time taken when the list was made goes stale
        override = {"since": time.time() + override["since_from_now"]}
    with pytest.raises(NoticeRefused) as err:
        accept(local_plan(), notice(**override).to_json(), peer, time.time())
    assert err.value.status == status and words in str(err.value)


@pytest.mark.parametrize(("body", "words"), [
    (b"{", "not JSON"),
    (b"[]", "not a failure notice"),
    (json.dumps({"schema": 2}).encode(), "not a failure notice"),
    (json.dumps({**json.loads(notice().to_json()), "extra": 1}).encode(), "fields"),
    (json.dumps({**json.loads(notice().to_json()), "generation": True}).encode(), "generation"),
    (json.dumps({**json.loads(notice().to_json()), "generation": 0}).encode(), "generation"),
    (json.dumps({**json.loads(notice().to_json()), "cohort": -1}).encode(), "cohort"),
    (json.dumps({**json.loads(notice().to_json()), "host": ""}).encode(), "host"),
    (json.dumps({**json.loads(notice().to_json()), "since": "now"}).encode(), "since"),
    (json.dumps({**json.loads(notice().to_json()), "since": 1e400}).encode(), "not a time"),
    (json.dumps({**json.loads(notice().to_json()), "evidence": []}).encode(), "evidence"),
    (json.dumps({**json.loads(notice().to_json()), "evidence": {"signal": {"nested": 1}}}).encode(), "evidence"),
    (json.dumps({**json.loads(notice().to_json()), "evidence": {"still_s": 1e400}}).encode(), "evidence"),
    (json.dumps({**json.loads(notice().to_json()), "evidence": {"x": "y" * 401}}).encode(), "evidence"),
    (json.dumps({**json.loads(notice().to_json()), "evidence": {str(i): i for i in range(17)}}).encode(), "evidence"),
])
def test_a_malformed_notice_is_refused_naming_what_is_wrong(body, words):
    with pytest.raises(NoticeRefused) as err:
        accept(local_plan(), body, NODE1, time.time())
    assert err.value.status == 400 and words in str(err.value)


def test_without_tls_a_node_is_known_by_its_address_only():
    plan = local_plan(insecure=True)
    assert sender_node(plan, Peer("127.0.0.2")) == "node1"
    assert sender_node(plan, Peer("127.0.0.9", common_name("llama", "node1"))) is None
    assert sender_node(local_plan(), Peer("127.0.0.2")) is None  # over TLS the address alone is nobody


# --- what is torn down -------------------------------------------------------------------------------------------
def test_a_notice_tears_down_the_rank_of_exactly_its_generation_and_is_remembered():
    r = rank(cohort=1, generation=3)
    sent = notice()
    assert notice_failed(sent, memory(r), FAILOVER, NOW) == [
        NoteFailure(1, KnownFailure(3, "rank-exited", sent.evidence, "node1", NOW.mono)),
        Record("teardown-requested", 1, 3, {"reason": "rank-exited", "by": "node1", "via": "notice"}),
        NoteDetected(1, 3, sent.since),
        TearDown(r, sent.since, FAILOVER.term_grace_s)]
    assert notice_failed(notice(generation=2), memory(r), FAILOVER, NOW) == []  # a newer generation runs here
    assert notice_failed(notice(generation=4), memory(r), FAILOVER, NOW) == []  # an older one: etcd retires it
    assert notice_failed(notice(cohort=0), memory(r), FAILOVER, NOW) == []  # no rank of that cohort here


def test_a_rank_torn_down_by_a_notice_is_not_declared_missing_before_the_declaring_agent_writes():
    """CI once: node2's GPU fault failed both cohorts; node0 took node2's notices, its teardowns ended in 63 ms,
    and its next view (etcd not written yet) showed the generations running with node0's ranks missing: node0
    declared rank-missing first, and the GPU fault was recorded as a missing rank. Now the notice's failure is
    remembered; the declaring agent's own write is waited for RELAY_AFTER_S, then written here with its cause."""
    gpu = {"signal": "gpu", "culprit_node": "node2", "culprit_rank": 2, "evidence": "Xid 79", "xid": 79}
    told = notice(reason="gpu-fault", host="node2", evidence=gpu)
    running = slot(1, 3, RUNNING, not_before=0.0)
    node = memory()  # the rank's teardown ended: no rank, nothing terminating
    node.known_failures[1] = notice_failed(told, memory(rank(cohort=1, generation=3)), FAILOVER, NOW)[0].failure
    assert launch_due(running, node, NOW) == [WakeAt(NOW.mono + RELAY_AFTER_S, full=True)]
    assert launch_due(running, node, at(RELAY_AFTER_S - 0.01)) == [WakeAt(NOW.mono + RELAY_AFTER_S, full=True)]
    relayed = launch_due(running, node, at(RELAY_AFTER_S))
    assert kinds(relayed) == ["Record:declaration-relayed", "Declare"]
    assert relayed[1] == Declare(1, 3, "gpu-fault") and relayed[1].evidence == {**gpu, "declared_by": "node2"}
    # a newer generation running: the notice was about an older one, this rank is missing for no known reason
    newer = slot(1, 4, RUNNING, not_before=0.0)
    assert kinds(launch_due(newer, node, NOW)) == ["Record:rank-missing", "Declare"]


def test_the_relays_wake_up_reconciles_the_latest_view_though_the_feed_brings_none(tmp_path: Path):
    """The relay is a decision of the clock: etcd may bring no news for a while (a node's feed reads it every
    SYNC_S, 1 s). The wake-up the relay asks for (WakeAt full) makes the loop reconcile the latest view at
    RELAY_AFTER_S, once; it used to move only the next metrics sync, and the declaration waited for the feed."""
    executor = node_executor(plan_for(2), "node0", None, EventLog(str(tmp_path / "events.jsonl"), "node0",
                                                                  journal=None), memory(), 1)
    schedule = executor.schedule
    latest = DeploymentView(slots={1: SlotEntry(slot(1, 3, RUNNING, not_before=0.0), 11)})
    assert schedule.view_to_reconcile(None, latest, NOW.mono) is None  # nothing due, no news: nothing
    executor([WakeAt(NOW.mono + RELAY_AFTER_S, full=True)])
    assert schedule.view_to_reconcile(None, latest, NOW.mono + RELAY_AFTER_S - 0.01) is None
    assert schedule.view_to_reconcile(None, latest, NOW.mono + RELAY_AFTER_S) is latest
    assert schedule.view_to_reconcile(None, latest, NOW.mono + RELAY_AFTER_S + 0.05) is None  # spent
    newer = DeploymentView(revision=12)
    assert schedule.view_to_reconcile(newer, latest, NOW.mono) is newer  # news is reconciled whenever it comes
    executor([WakeAt(NOW.mono + 0.3, full=True), WakeAt(NOW.mono + 0.2, full=True)])
    assert schedule.view_to_reconcile(newer, latest, NOW.mono) is newer  # a reconcile spends it: it asks again
    assert schedule.view_to_reconcile(None, latest, NOW.mono + 0.5) is None


def test_a_failure_declared_here_that_etcd_did_not_take_is_declared_again_with_its_cause_at_once():
    """Fault matrix row 2b: the rank died while etcd was away; once etcd answers, its node declares it with the
    reason and evidence it had, not as rank-missing."""
    exited = {"signal": "process-exit", "culprit_node": "node0", "culprit_rank": 0, "evidence": "main process 7"}
    node = memory()
    node.known_failures[1] = KnownFailure(3, "rank-exited", exited, None, NOW.mono)
    actions = launch_due(slot(1, 3, RUNNING, not_before=0.0), node, NOW)
    assert actions == [Declare(1, 3, "rank-exited")] and actions[0].evidence == exited


# --- over the wire -----------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_secrets(pki: Path, host: str) -> str:
    directory = pki / "hosts" / host
    shutil.copy(pki / "ca.crt", directory / "ca.crt")
    return str(directory)


def wait_for(condition, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.01)
    raise AssertionError("not in time")


def test_a_notice_travels_over_tls_on_a_kept_connection_and_only_nodes_may_send_one(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics_server, "IDLE_TIMEOUT_S", 0.5)
    pki = tmp_path / "pki"
    ensure_pki(str(pki), "llama", list(ADDRESSES.items()), [])
    port = free_port()
    plan0 = local_plan(node_secrets(pki, "node0"), port)
    plan1 = local_plan(node_secrets(pki, "node1"), port)
    wake_r, wake_w = os.pipe()
    inbox = Inbox(plan0, wake_w)

    def endpoint(keeps: bool = True) -> metrics_server.BoundedHTTPServer:  # node0's agent's
        return metrics_server.serve("127.0.0.1", port, lambda: (b"m 1\n", "text/plain"), lambda: True,
                                    agent_server_context(plan0), notices=inbox.receive,
                                    peers=lambda peer: keeps and sender_node(plan0, peer) is not None,
                                    peer_idle_s=PEER_IDLE_S, peer_count=2)

    server = endpoint()
    notifier = Notifier(plan1, "node1", os.pipe()[1])
    try:
        notifier.start()
        wait_for(lambda: len(notifier.links[0].connections._idle.get(notifier.links[0].origin, [])))  # warmed up
        time.sleep(metrics_server.IDLE_TIMEOUT_S + 0.5)  # longer than anyone else's connection is kept
        connection = notifier.links[0].connections._idle[notifier.links[0].origin][0]
        sent = notice()
        notifier.send(sent)
        taken, refused = wait_for(lambda: [n for n in [inbox.take()] if n[0] or n[1]])[0]
        assert (taken, refused) == ([sent], [])
        assert os.read(wake_r, 16), "the loop is woken"
        assert notifier.links[0].connections._idle[notifier.links[0].origin] == [connection], \
            "the notice went on the connection kept open since the warm-up (no handshake)"
        assert notifier.take_unsent() == []

        server.shutdown()
        server.server_close()
        server = endpoint(keeps=False)  # one that drops a node's kept connection (as a restarted agent's is gone)
        dropped = Notifier(plan1, "node1", os.pipe()[1])
        dropped.start()
        wait_for(lambda: len(dropped.links[0].connections._idle.get(dropped.links[0].origin, [])))
        time.sleep(metrics_server.IDLE_TIMEOUT_S + 0.5)  # dropped by now, without a TLS close_notify
        again = notice(generation=4)
        dropped.send(again)
        assert wait_for(lambda: [n for n in [inbox.take()] if n[0] or n[1]])[0] == ([again], [])
        assert dropped.take_unsent() == [], "sent again on a new connection"
        dropped.stop.set()

        origin = f"https://127.0.0.1:{port}"
        controller = KeptConnections(client_context(str(pki / "ca.crt"), str(pki / "controller/client.crt"),
                                                    str(pki / "controller/client.key")))
        status, body = controller.post(origin, "/notice", notice(host="node0").to_json(), {}, 5)
        assert status == 403 and b"not a node" in body
        node1 = KeptConnections(client_context(str(pki / "ca.crt"), str(pki / "hosts/node1/client.crt"),
                                               str(pki / "hosts/node1/client.key")))
        status, body = node1.post(origin, "/notice", notice(host="node0").to_json(), {}, 5)
        assert status == 403 and b"names deployment" in body  # node1 may speak for itself only
        status, _body = node1.post(origin, "/notice", b"x" * (metrics_server.MAX_BODY + 1), {}, 5)
        assert status == 413
        anonymous = KeptConnections(ssl.create_default_context(cafile=str(pki / "ca.crt")))
        with pytest.raises((OSError, ssl.SSLError)):
            anonymous.post(origin, "/notice", notice().to_json(), {}, 5)
        assert inbox.notices.empty() and len(inbox.take()[1]) == 2
    finally:
        notifier.stop.set()
        server.shutdown()
        server.server_close()
