"""The record layout's keys (record schema 3, common/coordination.py): a replica's records under
``replicas/<q>/``, a node's own deployment-wide; schema 2's layout (``replica`` None: every record under the
deployment's prefix) kept only to be moved (common/schema2.py) and as the fleet benchmark's anchor."""

from __future__ import annotations

from shadowline.common.coordination import Keys, Slot
from shadowline.common.etcd_client import KV
from shadowline.control.view import parse_view


def every_key(keys: Keys) -> dict[str, str]:
    return {"root": keys.root, "agent": keys.agent("n0"), "agents": keys.agents(), "slot": keys.slot(1),
            "slots": keys.slots(), "gone": keys.gone(1, 4), "gone_host": keys.gone(1, 4, "n0"),
            "active": keys.active(), "gms_lost": keys.gms_lost(), "gms_lost_host": keys.gms_lost("n0"),
            "rank": keys.rank(1, "n0"), "paused": keys.paused(), "fenced": keys.fenced(),
            "fenced_host": keys.fenced("n0")}


def test_schema_2s_keys_are_every_record_under_the_deployment():
    assert every_key(Keys("demo", None)) == {
        "root": "/shadowline/demo/", "agent": "/shadowline/demo/agents/n0", "agents": "/shadowline/demo/agents/",
        "slot": "/shadowline/demo/slots/1", "slots": "/shadowline/demo/slots/", "gone": "/shadowline/demo/gone/1/4/",
        "gone_host": "/shadowline/demo/gone/1/4/n0", "active": "/shadowline/demo/active",
        "gms_lost": "/shadowline/demo/gms_lost/", "gms_lost_host": "/shadowline/demo/gms_lost/n0",
        "rank": "/shadowline/demo/ranks/1/n0", "paused": "/shadowline/demo/paused",
        "fenced": "/shadowline/demo/fenced/", "fenced_host": "/shadowline/demo/fenced/n0"}
    assert Keys("demo", None).deployment_root == "/shadowline/demo/"


def test_a_replicas_records_live_under_it_and_a_nodes_own_stay_deployment_wide():
    for replica in (0, 3):
        keys, schema2 = every_key(Keys("demo", replica)), every_key(Keys("demo", None))
        under = f"/shadowline/demo/replicas/{replica}/"
        replica_scoped = {"root", "slot", "slots", "gone", "gone_host", "active", "rank", "paused"}
        for name, key in keys.items():
            if name in replica_scoped:
                assert key == schema2[name].replace("/shadowline/demo/", under, 1), name
            else:
                assert key == schema2[name], name
    assert Keys("demo", 0).node_keys(("n0", "n1")) == [
        "/shadowline/demo/agents/n0", "/shadowline/demo/gms_lost/n0", "/shadowline/demo/fenced/n0",
        "/shadowline/demo/agents/n1", "/shadowline/demo/gms_lost/n1", "/shadowline/demo/fenced/n1"]


def test_replicas_do_not_share_a_prefix_and_each_view_reads_its_own_records():
    one, eleven = Keys("demo", 1), Keys("demo", 11)
    assert not one.slot(0).startswith(eleven.root) and not eleven.slot(0).startswith(one.root)
    kvs = [KV(one.slot(0), Slot(0, 2, "running", replica=1).to_json().encode(), 5, 5, 0),
           KV(eleven.slot(0), Slot(0, 7, "running", replica=11).to_json().encode(), 6, 6, 0),
           KV(one.gone(0, 1, "n0"), b'{"time": 1.5}', 7, 7, 0), KV(one.paused(), b"{}", 8, 8, 0),
           KV(one.agent("n0"), b'{"instance": "9.a"}', 9, 9, 0), KV(one.fenced("n1"), b'{"why": "xid 79"}', 10, 10, 0),
           KV(one.gms_lost("n0"), b'{"time": 2.0}', 11, 11, 0)]
    view = parse_view(one, kvs, frozenset({0, 1}))
    assert view.slot(0).generation == 2 and view.gone_hosts(0, 1) == {"n0": 1.5} and view.paused == {}
    assert view.agent_instances == {"n0": "9.a"} and view.fenced == {"n1": {"why": "xid 79"}}
    assert view.gms_lost == {"n0": one.gms_lost("n0")}
    other = parse_view(eleven, kvs, frozenset({0}))
    assert other.slot(0).generation == 7 and other.paused is None and other.gone == {}


def test_a_slot_of_another_replica_under_this_ones_key_is_invalid_not_acted_on():
    keys = Keys("demo", 1)
    stray = KV(keys.slot(0), Slot(0, 4, "failed", replica=2).to_json().encode(), 5, 5, 0)
    view = parse_view(keys, [stray], frozenset({0}))
    assert view.slot(0) is None
    assert "replica 2" in view.invalid[keys.slot(0)].why
    older = KV(Keys("demo", 0).slot(0), b'{"schema": 2, "cohort": 0, "generation": 3, "state": "running"}', 6, 6, 0)
    assert parse_view(Keys("demo", 0), [older], frozenset({0})).slot(0).generation == 3  # schema 2: replica 0
