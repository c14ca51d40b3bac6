"""Slot transitions through a real etcd: a failure is declared once, whoever races; gone confirmations;
presence on a lease."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shadowline.common.coordination import FAILED, LAUNCHING, RUNNING, Coordination, Slot
from shadowline.common.etcd_client import Etcd
from tests.loopback import start_etcd


@pytest.fixture
def coord(tmp_path: Path):
    etcd = start_etcd(tmp_path)
    try:
        yield Coordination(Etcd(etcd.url), "unit", 0)
    finally:
        etcd.stop()


def test_failure_is_declared_exactly_once_by_racing_agents(coord: Coordination):
    assert coord.create_slot(Slot(cohort=0, generation=1, state=RUNNING))
    assert not coord.create_slot(Slot(cohort=0, generation=1, state=RUNNING))  # already there
    winners: list[str] = []

    def agent(host: str) -> None:
        if coord.declare_failed(0, 1, "rank-exited", host):
            winners.append(host)

    threads = [threading.Thread(target=agent, args=(f"node{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    slot, _unused = coord.slot(0)
    assert slot is not None and slot.state == FAILED and slot.detected_by == winners[0]
    assert coord.declare_failed(0, 1, "rank-exited", "late") is None  # a failed generation stays failed


def test_an_old_generation_cannot_fail_the_new_one(coord: Coordination):
    coord.create_slot(Slot(cohort=1, generation=1, state=RUNNING))
    slot, revision = coord.slot(1)
    assert slot is not None
    assert coord.swap(Slot(cohort=1, generation=2, state=LAUNCHING), revision)
    assert coord.declare_failed(1, 1, "rank-exited", "node0") is None
    assert coord.declare_failed(1, 2, "launch-failed", "node0") is not None


def test_swap_refuses_a_stale_revision(coord: Coordination):
    coord.create_slot(Slot(cohort=2, generation=1, state=RUNNING))
    _unused, revision = coord.slot(2)
    assert coord.swap(Slot(cohort=2, generation=1, state=FAILED), revision)
    assert not coord.swap(Slot(cohort=2, generation=2, state=LAUNCHING), revision)


def test_gone_confirmations_and_presence(coord: Coordination):
    coord.confirm_gone(0, 3, "node0", 10.0)
    coord.confirm_gone(0, 3, "node1", 11.5)
    coord.confirm_gone(0, 4, "node0", 12.0)
    assert coord.gone_hosts(0, 3) == {"node0": 10.0, "node1": 11.5}
    lease = coord.etcd.lease_grant(5)
    coord.etcd.put(coord.keys.agent("node0"), "{}", lease=lease)
    assert coord.live_agents() == {"node0"}
    coord.etcd.lease_revoke(lease)
    assert coord.live_agents() == set()
