"""Automatic failover paused for maintenance (control/pause.py, playbooks/pause.yml, `shadowline pause`): what is
held while paused, the pause record in the view, and the executor against a real etcd on loopback: a declaration
made while paused leaves the slot running and is reported once; the same declaration without the pause fails
the generation. The agents' restart on resume is the drills' to prove (tests/e2e/test_drills.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shadowline import cli
from shadowline.common.coordination import FAILED, LAUNCHING, RUNNING, Coordination, Keys, Slot
from shadowline.common.etcd_client import KV, Etcd
from shadowline.common.events import EventLog, read_events
from shadowline.control import failover
from shadowline.control.actions import Declare, Record, SwapSlot, WakeAt
from shadowline.control.memory import NodeMemory
from shadowline.control.pause import HELD, held_record, held_while_paused
from shadowline.control.view import DeploymentView, parse_view
from tests.loopback import ETCD, start_etcd

from .test_executor_order import node_executor, two_nodes

PAUSED = {"by": "alice", "since": 1795640188.7, "reason": "switch firmware"}
DECLARE = Declare(1, 4, "leader-hung", {"signal": "health"})
RELAUNCH = SwapSlot(Slot(1, 5, LAUNCHING), 11, "relaunch")
RUNNING_SWAP = SwapSlot(Slot(1, 5, RUNNING), 12, "running")


@pytest.mark.parametrize(("paused", "kept", "held"), [
    (None, [DECLARE, RELAUNCH, RUNNING_SWAP], []),
    (PAUSED, [RUNNING_SWAP], [DECLARE, RELAUNCH]),
])
def test_while_paused_declarations_and_failover_slot_changes_are_held(paused, kept, held):
    other = [Record("rank-launched", 1, 5), WakeAt(12.5)]  # what a node does besides: never held
    actions, holding = held_while_paused([DECLARE, *other, RELAUNCH, RUNNING_SWAP], paused)
    assert [a for a in actions if a not in other] == kept and holding == held
    assert all(a in actions for a in other)


@pytest.mark.parametrize("kind", ["relaunch", "dead", "repair"])
def test_every_slot_change_that_fails_over_is_held(kind):
    assert held_while_paused([SwapSlot(Slot(0, 2, FAILED), 3, kind)], PAUSED)[0] == []


def test_a_held_decision_says_what_and_why_and_the_pause():
    key, record = held_record(DECLARE, PAUSED)
    assert key == ("declare", 1, 4, "leader-hung")
    assert record.event == HELD and (record.cohort, record.generation) == (1, 4)
    assert record.fields["reason"] == "leader-hung" and record.fields["paused"]["reason"] == "switch firmware"
    assert held_record(RELAUNCH, PAUSED)[0] == ("slot", 1, 5, "relaunch")


def test_the_pause_record_is_in_the_view_whatever_its_spelling():
    keys = Keys("demo", 0)

    def view_of(value: bytes) -> DeploymentView:
        return parse_view(keys, [KV(keys.paused(), value, 3, 3, 0)], frozenset({0, 1}))

    assert view_of(json.dumps(PAUSED).encode()).paused == PAUSED
    assert view_of(b"maintenance").paused == {"reason": "maintenance"}  # an etcdctl put by hand pauses too
    assert view_of(b"[1]").paused == {"reason": "[1]"}
    assert parse_view(keys, [], frozenset({0, 1})).paused is None


def test_the_executor_holds_a_declaration_while_paused_and_makes_it_once_resumed(tmp_path: Path):
    if not os.path.exists(ETCD):
        pytest.skip("no etcd binary")
    plan, hosts = two_nodes(tmp_path)
    server = start_etcd(tmp_path)
    try:
        etcd = Etcd(server.url)
        coord = Coordination(etcd, plan.deployment, 0)
        assert coord.create_slot(Slot(1, 4, RUNNING))
        events_path = tmp_path / "events.jsonl"
        executor = node_executor(plan, hosts[0], etcd, EventLog(str(events_path), hosts[0], journal=None),
                                 NodeMemory(), 1)
        executor.view = DeploymentView(paused=PAUSED)
        executor([DECLARE])
        executor([DECLARE])  # the same decision next tick: not news
        slot, _revision = coord.slot(1)
        assert slot is not None and slot.state == RUNNING, "a declaration went through while paused"
        held = [e for e in read_events(str(events_path)) if e["event"] == HELD]
        assert len(held) == 1 and held[0]["detail"]["reason"] == "leader-hung"
        executor.view = DeploymentView()
        executor([DECLARE])
        slot, _revision = coord.slot(1)
        assert slot is not None and (slot.state, slot.reason) == (FAILED, "leader-hung")
    finally:
        server.stop()


def test_pausing_twice_keeps_the_first_record_and_resuming_removes_it(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    if not os.path.exists(ETCD):
        pytest.skip("no etcd binary")
    plan, _hosts = two_nodes(tmp_path)
    server = start_etcd(tmp_path)
    try:
        monkeypatch.setattr(failover, "operator_etcd", lambda _plan: Etcd(server.url))
        assert failover.set_paused(plan, True, "switch firmware", "alice", check=True)["changed"]
        assert Etcd(server.url).get(Keys(plan.deployment, 0).paused()) is None, "check mode wrote the record"
        first = failover.set_paused(plan, True, "switch firmware", "alice")
        assert first["changed"] and first["before"] is None and first["after"]["by"] == "alice"
        again = failover.set_paused(plan, True, "another reason", "bob")
        assert not again["changed"] and again["after"]["reason"] == "switch firmware"
        resumed = failover.set_paused(plan, False)
        assert resumed["changed"] and resumed["after"] is None and resumed["before"]["reason"] == "switch firmware"
        assert not failover.set_paused(plan, False)["changed"]
    finally:
        server.stop()


def test_the_command_has_pause_and_resume_and_completes_them():
    parser = cli.build_parser()
    args = parser.parse_args(["pause", "-i", "inv", "--reason", "switch firmware"])
    assert (args.command, args.reason, args.check) == ("pause", "switch firmware", False)
    assert parser.parse_args(["resume", "-i", "inv", "--check"]).check
    with pytest.raises(SystemExit):
        parser.parse_args(["resume"])  # -i is required: no default deployment is paused by accident
    assert "pause" in cli.bash_completion(parser) and "resume" in cli.zsh_completion(parser)


def test_the_status_table_says_whether_failover_is_paused_and_reads_it_back():
    from shadowline.cluster.status_table import (
        render_status_table,
        status_document,
        table_failover,
        table_rows,
        table_states,
    )
    from shadowline.control.pause import describe_pause

    ranks = [{"cohort": 0, "role": "primary", "host": "node0", "rank": 0, "leader": True, "pid": 7, "state": "active",
              "ports": {"master": 29500, "system": 8080, "nixl": 5600}}]
    said = describe_pause(PAUSED)
    assert said == "PAUSED since 2026-11-25 20:56:28 UTC by alice: switch firmware"
    assert describe_pause(None) == "automatic" and "(no reason given)" in describe_pause({"since": "x"})
    lines = render_status_table(ranks, "engine-0", "m@0123456789ab", said).splitlines()
    assert lines[-1] == f"failover: {said}" and table_states(lines) == ["active"]
    assert table_failover(lines) == said
    document = status_document(*table_rows(lines), table_failover(lines))
    assert document["failover"] == said and len(document["ranks"]) == 1 and document["whole"]
