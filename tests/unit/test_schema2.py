"""Schema 2's records moved to replica 0 (common/schema2.py), through a real etcd: every record tree and single
record moves, a node's own stay, a second move changes nothing, a newer copy is never overwritten, and a record
an older agent writes again after the move is moved by the next agent to start; the feed moves them before its
first view."""

from __future__ import annotations

import os

import pytest

from shadowline.common.coordination import Keys, Slot
from shadowline.common.etcd_client import Etcd
from shadowline.common.schema2 import move_schema2
from shadowline.control.feed import EtcdFeed

OLD, NEW = Keys("up", None), Keys("up", 0)



def schema2_slot(generation: int, state: str = "running") -> str:
    return f'{{"schema": 2, "cohort": 0, "generation": {generation}, "state": "{state}", "config": "abc"}}'


def write_schema2(etcd: Etcd) -> None:
    etcd.put(OLD.slot(0), schema2_slot(7))
    etcd.put(OLD.gone(0, 6, "node1"), '{"time": 1.0}')
    etcd.put(OLD.rank(0, "node1"), '{"generation": 7, "config": "abc", "pid": 9, "agent": "1.a"}')
    etcd.put(OLD.active(), '{"cohort": 0, "generation": 7, "since": 1.0}')
    etcd.put(OLD.paused(), '{"by": "ops", "reason": "maintenance"}')
    etcd.put(OLD.gms_lost("node1"), '{"time": 2.0}')
    etcd.put(OLD.fenced("node2"), '{"why": "xid 79"}')


def test_every_record_of_schema_2_moves_under_replica_0_and_a_nodes_own_stay(etcd: Etcd):
    write_schema2(etcd)
    moved = move_schema2(etcd, NEW)
    assert sorted(moved.copied) == ["active", "gone/0/6/node1", "paused", "ranks/0/node1", "slots/0"]
    assert moved.removed == 5
    assert [kv.key for kv in etcd.get_prefix(OLD.slots())] == []
    assert Slot.parse(etcd.get(NEW.slot(0)).value).generation == 7
    assert etcd.get(NEW.paused()).value == b'{"by": "ops", "reason": "maintenance"}'
    assert etcd.get(OLD.gms_lost("node1")) is not None and etcd.get(OLD.fenced("node2")) is not None
    again = move_schema2(etcd, NEW)
    assert again.copied == () and again.removed == 0


def test_a_newer_copy_is_kept_and_a_later_schema_2_write_moves_over_an_older_copy(etcd: Etcd):
    etcd.put(OLD.slot(0), schema2_slot(7))
    etcd.put(NEW.slot(0), Slot(0, 8, "launching").to_json())  # a schema 3 agent wrote after it
    moved = move_schema2(etcd, NEW)
    assert moved.copied == () and moved.removed == 1
    assert Slot.parse(etcd.get(NEW.slot(0)).value).generation == 8
    etcd.put(OLD.slot(0), schema2_slot(9, "failed"))  # an older agent, still running, declares after that
    assert move_schema2(etcd, NEW).copied == ("slots/0",)
    assert Slot.parse(etcd.get(NEW.slot(0)).value).state == "failed"


def test_only_replica_0_holds_schema_2s_records(etcd: Etcd):
    with pytest.raises(ValueError, match="replica 0"):
        move_schema2(etcd, Keys("up", 1))


def test_the_feed_of_replica_0_moves_them_before_its_first_view(etcd: Etcd):
    write_schema2(etcd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    try:
        feed = EtcdFeed(etcd, NEW, "node0", ("node0", "node1", "node2"), frozenset({0}), 5, 60.0, wake_w)
        feed.read()
        news = feed.take()
        assert news.view.slot(0).generation == 7 and news.view.active.generation == 7
        assert news.view.paused == {"by": "ops", "reason": "maintenance"}
        assert news.view.fenced == {"node2": {"why": "xid 79"}} and set(news.view.gms_lost) == {"node1"}
        moved = [n for n in news.notices if n.event == "records-moved"]
        assert len(moved) == 1 and moved[0].fields["copied"] == 5
        feed.read()
        assert not [n for n in feed.take().notices if n.event == "records-moved"]
    finally:
        os.close(wake_r)
        os.close(wake_w)
