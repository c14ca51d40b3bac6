"""The agent's etcd side under faults, against a real etcd 3.4 on 127.0.0.1 (fault matrix rows 5 and 7 in small,
and the deadline of a call over unreachable endpoints): answers cut short, members that never answer, a watch
whose revision was compacted away. Every failure must come out as EtcdError (which the agent handles), never as
another exception that would end a thread, and the feed must carry on."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from shadowline.common.coordination import FAILED, RUNNING, Coordination, Keys, Slot
from shadowline.common.etcd_client import Etcd, EtcdError
from shadowline.common.http import KeptConnections
from shadowline.control.feed import EtcdFeed

from ..loopback import CuttingProxy, start_etcd, wait_until


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory):
    server = start_etcd(tmp_path_factory.mktemp("etcd"))
    yield server
    server.stop()


def target_of(url: str) -> tuple[str, int]:
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    return host, int(port)


def test_answers_cut_short_are_etcd_errors_and_another_endpoint_answers(etcd_server):
    """Row 7: a proxy that cuts one answer in ten. Alone, a cut answer is an EtcdError; with the real member
    beside it, every call succeeds."""
    proxy = CuttingProxy(target_of(etcd_server.url), every=10)
    try:
        alone = Etcd(proxy.url, timeout=2.0, deadline=2.0)
        errors = 0
        for i in range(40):
            try:
                alone.put(f"cut/{i}", "x")
                alone.get_prefix("cut/")
            except EtcdError:
                errors += 1  # anything else escapes and fails the test
        assert errors >= 4
        both = Etcd([proxy.url, etcd_server.url], timeout=2.0, deadline=3.0)
        for i in range(40):
            both.put(f"cut/{i}", "y")
            assert both.get(f"cut/{i}").value == b"y"
            both._preferred = 0  # keep asking the cutting proxy first
    finally:
        proxy.close()
        Etcd(etcd_server.url).delete_prefix("cut/")


def test_calls_share_kept_alive_connections(etcd_server):
    """One connection (one TLS handshake, over TLS) carries a client's calls; threads calling at once each get one,
    and no more than KeptConnections.IDLE_PER_ORIGIN stay open after them."""
    proxy = CuttingProxy(target_of(etcd_server.url), every=0)
    try:
        etcd = Etcd(proxy.url)
        for i in range(30):
            etcd.put(f"kept/{i}", "x")
            assert etcd.get(f"kept/{i}").value == b"x"
        assert proxy.connections == 1
        failures: list[BaseException] = []

        def calls(n: int) -> None:
            try:
                for i in range(20):
                    etcd.put(f"kept/{n}/{i}", "y")
            except BaseException as err:  # noqa: BLE001 (reported by the assert below)
                failures.append(err)

        threads = [threading.Thread(target=calls, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures
        assert 1 < proxy.connections <= 9
        assert len(etcd._connections._idle[proxy.url]) <= KeptConnections.IDLE_PER_ORIGIN  # noqa: SLF001
    finally:
        proxy.close()
        Etcd(etcd_server.url).delete_prefix("kept/")


def test_a_connection_the_server_closed_while_idle_is_replaced(etcd_server):
    """A kept connection that the server closed after its last answer fails at the next request: that request
    goes out again on a new connection, and the call succeeds (never an EtcdError for it)."""
    proxy = CuttingProxy(target_of(etcd_server.url), every=0, per_connection=1)
    try:
        etcd = Etcd(proxy.url, timeout=2.0, deadline=2.0)
        for i in range(20):
            etcd.put(f"idle/{i}", "x")
            assert etcd.get(f"idle/{i}").value == b"x"
            time.sleep(0.01)  # the proxy's close reaches the client before its next request
        assert proxy.connections == 40
    finally:
        proxy.close()
        Etcd(etcd_server.url).delete_prefix("idle/")


def test_one_call_over_members_that_never_answer_ends_at_its_deadline():
    """Three members that accept connections and never answer: one call costs its deadline, not 3 timeouts."""
    silent = [socket.create_server(("127.0.0.1", 0)) for _unused in range(3)]
    try:
        etcd = Etcd([f"http://127.0.0.1:{s.getsockname()[1]}" for s in silent], timeout=1.0, deadline=1.5)
        start = time.monotonic()
        with pytest.raises(EtcdError) as err:
            etcd.get("x")
        took = time.monotonic() - start
        assert took < 2.0, f"one call blocked {took:.2f} s"
        assert "deadline" in str(err.value)
    finally:
        for s in silent:
            s.close()


def test_the_feed_resyncs_after_its_watch_revision_was_compacted(etcd_server):
    """Row 5 in small: the feed's watch revision is compacted away; it reads the view again and watches on."""
    etcd = Etcd(etcd_server.url)
    keys = Keys("resync", 0)
    for generation in range(1, 6):
        etcd.put(keys.slot(0), Slot(cohort=0, generation=generation, state="running").to_json())
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    feed = EtcdFeed(Etcd(etcd_server.url), keys, "node0", ("node0",), frozenset({0}), 5, 60.0, wake_w)  # no periodic read
    try:
        feed.read()
        first = feed.take().view
        assert first.slot(0).generation == 5
        with pytest.raises(EtcdError) as err:  # etcd cancels a watch from a compacted revision...
            etcd.compact(first.revision)
            etcd.watch(keys.root, first.revision - 3, timeout=2)
        assert err.value.compacted == first.revision
        etcd.defragment()
        feed.revision = first.revision - 3  # ...so a feed that fell behind that far...
        etcd.put(keys.slot(0), Slot(cohort=0, generation=6, state="running").to_json())
        feed.start()
        notices: list[str] = []

        def resynced() -> bool:  # ...reads the view again and watches on from there
            news = feed.take()
            notices.extend(n.event for n in news.notices)
            return news.view is not None and news.view.slot(0).generation == 6 and "watch-resync" in notices

        wait_until(resynced, 10, what="a resync after the compaction")
        etcd.put(keys.slot(0), Slot(cohort=0, generation=7, state="failed").to_json())
        news = wait_until(lambda: [s for s in feed.take().slots if s.generation == 7], 10, what="the next change")
        assert news[0].state == "failed"  # the watch goes on after the resync
    finally:
        feed.stop.set()
        os.close(wake_r)
        os.close(wake_w)
        etcd.delete_prefix(keys.root)


@pytest.mark.parametrize("members", ["one", "two"])
def test_a_declaration_whose_answer_was_cut_short_is_known_as_ours(etcd_server, members):
    """Row 7's ambiguity: etcd applied the declaration, its answer was cut. Alone, the call failed; with another
    member, the retried compare-and-swap found the record changed. Either way the record says it was ours."""
    proxy = CuttingProxy(target_of(etcd_server.url), every=1, only=b"/v3/kv/txn")
    deployment = f"cut-declare-{members}"
    try:
        Coordination(Etcd(etcd_server.url), deployment, 0).create_slot(Slot(cohort=0, generation=3, state=RUNNING))
        endpoints = [proxy.url] if members == "one" else [proxy.url, etcd_server.url]
        # bounds a loaded CI machine's etcd (an fsync behind other I/O) stays within: the call must fail by the cut
        coord = Coordination(Etcd(endpoints, timeout=5.0, deadline=12.0), deployment, 0)
        declared = coord.declare_failed(0, 3, "rank-exited", "node2")
        assert declared is not None and declared.state == FAILED and declared.detected_by == "node2"
        assert proxy.count >= 1, "the proxy cut no answer"
        assert coord.declare_failed(0, 3, "rank-exited", "node1") is None  # declared once only
    finally:
        proxy.close()
        Etcd(etcd_server.url).delete_prefix(f"/shadowline/{deployment}/")


def test_a_declaration_starts_from_the_view_and_survives_a_stale_one(etcd_server):
    """The hot path: the agent's view gives the slot and its revision, one compare-and-swap declares; a stale view
    (the slot changed since) falls back to reading it; a view of a newer generation declares nothing twice."""
    coord = Coordination(Etcd(etcd_server.url), "declare-known", 0)
    try:
        coord.create_slot(Slot(cohort=0, generation=3, state=RUNNING))
        fresh = coord.slot(0)
        assert coord.declare_failed(0, 3, "rank-exited", "node2", known=fresh).detected_by == "node2"
        coord.swap(Slot(cohort=0, generation=4, state=RUNNING), coord.slot(0)[1])
        stale = (Slot(cohort=0, generation=4, state=RUNNING), fresh[1])  # the revision of an older record
        declared = coord.declare_failed(0, 4, "leader-hung", "node0", known=stale)
        assert declared is not None and coord.slot(0)[0].reason == "leader-hung"
        assert coord.declare_failed(0, 4, "rank-exited", "node1", known=coord.slot(0)) is None  # once only
    finally:
        Etcd(etcd_server.url).delete_prefix("/shadowline/declare-known/")
