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

from shadowline.control import metrics_server
from shadowline.control.access import agent_server_context, client_context
from shadowline.control.actions import NoteDetected, Record, TearDown
from shadowline.control.failure_notices import (
    MAX_AGE_S,
    PEER_IDLE_S,
    FailureNotice,
    Inbox,
    NoticeRefused,
    Notifier,
    accept,
    sender_node,
)
from shadowline.control.http import KeptConnections
from shadowline.control.metrics_server import Peer
from shadowline.control.node_duties import notice_failed
from shadowline.deployment.pki import common_name, ensure_pki
from shadowline.deployment.plan import Plan

from .test_agent_node import FAILOVER, memory, rank
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
              "since": time.time()}
    return FailureNotice(**{**fields, **override})


NODE1 = Peer("127.0.0.2", common_name("llama", "node1"))


# --- what is taken -----------------------------------------------------------------------------------------------
def test_a_recent_notice_of_a_node_about_itself_is_taken():
    sent = notice()
    assert accept(local_plan(), sent.to_json(), NODE1, time.time()) == sent


@pytest.mark.parametrize(("peer", "override", "status", "words"), [
    (Peer("127.0.0.9", common_name("llama", "controller")), {}, 403, "not a node"),
    (Peer("127.0.0.1", common_name("llama", "prometheus")), {}, 403, "not a node"),
    (Peer("127.0.0.2", common_name("another", "node1")), {}, 403, "not a node"),
    (NODE1, {"host": "node0"}, 403, "names deployment"),
    (NODE1, {"deployment": "another"}, 403, "names deployment"),
    (NODE1, {"since": time.time() - MAX_AGE_S - 5}, 409, "ago"),
    (NODE1, {"since": time.time() + MAX_AGE_S + 5}, 409, "ago"),
])
def test_a_notice_from_someone_else_or_about_another_node_or_old_is_refused(peer, override, status, words):
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
def test_a_notice_tears_down_the_rank_of_exactly_its_generation():
    r = rank(cohort=1, generation=3)
    sent = notice()
    assert notice_failed(sent, memory(r), FAILOVER) == [
        Record("teardown-requested", 1, 3, {"reason": "rank-exited", "by": "node1", "via": "notice"}),
        NoteDetected(1, 3, sent.since),
        TearDown(r, sent.since, FAILOVER.term_grace_s)]
    assert notice_failed(notice(generation=2), memory(r), FAILOVER) == []  # a newer generation runs here
    assert notice_failed(notice(generation=4), memory(r), FAILOVER) == []  # an older one: etcd retires it
    assert notice_failed(notice(cohort=0), memory(r), FAILOVER) == []  # no rank of that cohort here


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
