"""shadowline.common.etcd_client against a real etcd 3.4 on 127.0.0.1 (the node agent depends on this API)."""

from __future__ import annotations

import threading
import time

import pytest

from shadowline.common.etcd_client import KV, Etcd, EtcdError, Event, prefix_end

from ..loopback import free_port, start_etcd


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory):
    server = start_etcd(tmp_path_factory.mktemp("etcd"))
    yield server
    server.stop()


@pytest.fixture
def etcd(etcd_server, request) -> Etcd:
    client = Etcd(etcd_server.url)
    yield client
    client.delete_prefix("t/")


def test_put_get_delete_roundtrip(etcd):
    rev = etcd.put("t/a", "hello")
    kv = etcd.get("t/a")
    assert isinstance(kv, KV)
    assert (kv.key, kv.value, kv.mod_revision, kv.create_revision, kv.lease) == ("t/a", b"hello", rev, rev, 0)
    rev2 = etcd.put("t/a", b"\x00\xffbytes")
    kv2 = etcd.get("t/a")
    assert kv2.value == b"\x00\xffbytes" and kv2.mod_revision == rev2 > rev and kv2.create_revision == rev
    assert etcd.get("t/missing") is None
    assert etcd.delete("t/a") == 1
    assert etcd.delete("t/a") == 0
    assert etcd.get("t/a") is None


def test_get_prefix_and_delete_prefix(etcd):
    for key in ("t/p/b", "t/p/a", "t/p/c/d", "t/q", "t/p"):
        etcd.put(key, key)
    assert [kv.key for kv in etcd.get_prefix("t/p/")] == ["t/p/a", "t/p/b", "t/p/c/d"]
    assert [kv.key for kv in etcd.get_prefix("t/p")] == ["t/p", "t/p/a", "t/p/b", "t/p/c/d"]
    assert etcd.get_prefix("t/none/") == []
    assert etcd.delete_prefix("t/p/") == 3
    assert [kv.key for kv in etcd.get_prefix("t/")] == ["t/p", "t/q"]


def test_prefix_end():
    assert prefix_end("a/") == b"a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"


def test_lease_grant_ttl_keepalive_revoke(etcd):
    lease = etcd.lease_grant(30)
    assert lease > 0
    assert 28 <= etcd.lease_ttl(lease) <= 30
    etcd.put("t/l/1", "x", lease=lease)
    etcd.put("t/l/2", "y", lease=lease)
    assert {kv.lease for kv in etcd.get_prefix("t/l/")} == {lease}
    assert etcd.lease_keepalive(lease) == 30
    assert etcd.lease_revoke(lease) is True
    assert etcd.get_prefix("t/l/") == []  # revoking deletes every key on the lease
    assert etcd.lease_revoke(lease) is False
    assert etcd.lease_keepalive(lease) == 0
    assert etcd.lease_ttl(lease) == -1


def test_lease_expires(etcd):
    lease = etcd.lease_grant(1)
    etcd.put("t/exp", "x", lease=lease)
    deadline = time.monotonic() + 5
    while etcd.get("t/exp") is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert etcd.get("t/exp") is None
    assert etcd.lease_keepalive(lease) == 0
    assert etcd.lease_ttl(lease) == -1


def test_txn_put_if_absent(etcd):
    assert etcd.txn_put_if_absent("t/once", "first") is True
    assert etcd.txn_put_if_absent("t/once", "second") is False
    assert etcd.get("t/once").value == b"first"
    lease = etcd.lease_grant(30)
    assert etcd.txn_put_if_absent("t/leased", "v", lease=lease) is True
    assert etcd.get("t/leased").lease == lease
    etcd.lease_revoke(lease)


def test_txn_compare_and_swap(etcd):
    etcd.put("t/cas", "1")
    kv = etcd.get("t/cas")
    assert etcd.txn_compare_and_swap("t/cas", kv.mod_revision, "2") is True
    assert etcd.txn_compare_and_swap("t/cas", kv.mod_revision, "3") is False  # stale revision
    assert etcd.get("t/cas").value == b"2"
    assert etcd.txn_compare_and_swap("t/new", 0, "n") is True  # 0: must not exist
    assert etcd.txn_compare_and_swap("t/new", 0, "m") is False


def test_watch_returns_history_and_new_events(etcd):
    start = etcd.put("t/w/x", "0")
    etcd.put("t/w/a", "1")
    etcd.delete("t/w/a")
    etcd.put("t/other", "not watched")
    events = etcd.watch("t/w/", start, timeout=2)
    assert [(e.type, e.key, e.value) for e in events] == [("put", "t/w/a", b"1"), ("delete", "t/w/a", b"")]
    assert all(isinstance(e, Event) for e in events)
    last = events[-1].mod_revision

    def later() -> None:
        time.sleep(0.3)
        etcd.put("t/w/b", "2")

    threading.Thread(target=later).start()
    started = time.monotonic()
    events = etcd.watch("t/w/", last, timeout=5)
    waited = time.monotonic() - started
    assert [(e.type, e.key, e.value) for e in events] == [("put", "t/w/b", b"2")]
    assert 0.2 < waited < 2.0, f"watch returned after {waited:.2f} s"


def test_watch_times_out_empty(etcd):
    rev = etcd.put("t/w2/x", "0")
    started = time.monotonic()
    assert etcd.watch("t/w2/", rev, timeout=0.5) == []
    assert 0.4 < time.monotonic() - started < 2.0


def test_watch_of_compacted_revision_raises(etcd):
    rev = etcd.put("t/c", "1")
    etcd.put("t/c", "2")
    last = etcd.put("t/c", "3")
    etcd._call("/v3/kv/compaction", {"revision": str(last)})
    with pytest.raises(EtcdError, match="compacted"):
        etcd.watch("t/", rev, timeout=2)


def test_endpoints_tried_in_turn(etcd_server):
    dead = f"http://127.0.0.1:{free_port()}"
    client = Etcd(f"{dead}, {etcd_server.url}", timeout=1.0)
    assert client.endpoints == [dead, etcd_server.url]
    client.put("t/turn", "x")
    assert client.get("t/turn").value == b"x"
    assert client.endpoints[client._preferred] == etcd_server.url  # the working one is tried first next time
    client.delete("t/turn")
    plain = Etcd([etcd_server.url.removeprefix("http://")])
    assert plain.get("t/turn") is None


def test_unreachable_endpoint_names_it():
    dead = f"127.0.0.1:{free_port()}"
    client = Etcd(dead, timeout=0.5)
    with pytest.raises(EtcdError, match=f"http://{dead}"):
        client.get("x")
    with pytest.raises(EtcdError, match=f"http://{dead}"):
        client.watch("x", 0, 0.2)


def test_errors_from_etcd_name_the_endpoint(etcd_server):
    client = Etcd(etcd_server.url)
    with pytest.raises(EtcdError, match=etcd_server.url) as err:
        client._call("/v3/kv/range", {"key": 5})
    assert err.value.code == 3  # InvalidArgument
    with pytest.raises(EtcdError, match="no etcd endpoint given"):
        Etcd("")
