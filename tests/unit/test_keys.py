"""The record layout's keys: a deployment's (today's, unchanged) and one replica's of a fleet (docs/fleet-design.md:
the replica's records under ``replicas/<q>/``, a node's own deployment-wide)."""

from __future__ import annotations

from shadowline.common.coordination import Keys
from shadowline.common.etcd_client import KV
from shadowline.control.view import parse_view


def every_key(keys: Keys) -> dict[str, str]:
    return {"root": keys.root, "agent": keys.agent("n0"), "agents": keys.agents(), "slot": keys.slot(1),
            "slots": keys.slots(), "gone": keys.gone(1, 4), "gone_host": keys.gone(1, 4, "n0"),
            "active": keys.active(), "gms_lost": keys.gms_lost(), "gms_lost_host": keys.gms_lost("n0"),
            "rank": keys.rank(1, "n0"), "paused": keys.paused(), "fenced": keys.fenced(),
            "fenced_host": keys.fenced("n0")}


def test_a_deployments_keys_are_todays():
    assert every_key(Keys("demo")) == {
        "root": "/shadowline/demo/", "agent": "/shadowline/demo/agents/n0", "agents": "/shadowline/demo/agents/",
        "slot": "/shadowline/demo/slots/1", "slots": "/shadowline/demo/slots/", "gone": "/shadowline/demo/gone/1/4/",
        "gone_host": "/shadowline/demo/gone/1/4/n0", "active": "/shadowline/demo/active",
        "gms_lost": "/shadowline/demo/gms_lost/", "gms_lost_host": "/shadowline/demo/gms_lost/n0",
        "rank": "/shadowline/demo/ranks/1/n0", "paused": "/shadowline/demo/paused",
        "fenced": "/shadowline/demo/fenced/", "fenced_host": "/shadowline/demo/fenced/n0"}
    assert every_key(Keys("demo", replica=None)) == every_key(Keys("demo"))
    assert Keys("demo").deployment_root == "/shadowline/demo/"


def test_a_replicas_records_live_under_it_and_a_nodes_own_stay_deployment_wide():
    keys, deployment = every_key(Keys("demo", replica=3)), every_key(Keys("demo"))
    under = "/shadowline/demo/replicas/3/"
    replica_scoped = {"root", "slot", "slots", "gone", "gone_host", "active", "rank", "paused"}
    for name, key in keys.items():
        if name in replica_scoped:
            assert key == deployment[name].replace("/shadowline/demo/", under, 1), name
        else:
            assert key == deployment[name], name
    assert Keys("demo", replica=0).root == "/shadowline/demo/replicas/0/"  # replica 0 is a replica, not None


def test_replicas_do_not_share_a_prefix_and_each_view_reads_its_own_records():
    one, eleven = Keys("demo", replica=1), Keys("demo", replica=11)
    assert not one.slot(0).startswith(eleven.root) and not eleven.slot(0).startswith(one.root)
    slot = b'{"cohort": 0, "generation": 2, "state": "running"}'
    kvs = [KV(one.slot(0), slot, 5, 5, 0), KV(eleven.slot(0), slot.replace(b"2", b"7"), 6, 6, 0),
           KV(one.gone(0, 1, "n0"), b'{"time": 1.5}', 7, 7, 0), KV(one.paused(), b"{}", 8, 8, 0)]
    view = parse_view(one, kvs, frozenset({0, 1}))
    assert view.slot(0).generation == 2 and view.gone_hosts(0, 1) == {"n0": 1.5} and view.paused == {}
    assert parse_view(eleven, kvs, frozenset({0})).slot(0).generation == 7
