"""A replica's membership record and the spares' claims through a real etcd (control/membership_store.py): created
once at epoch 1; changed only to the next epoch, by compare-and-swap on the revision it was read at, so of drivers
racing from one epoch exactly one writes the next, and a driver that read an older epoch (back from a partition)
is refused; a spare is claimed once, whichever replicas race for it; a broken record is refused naming why."""

from __future__ import annotations

import threading

import pytest

from shadowline.common.coordination import Keys, RecordInvalid
from shadowline.common.etcd_client import Etcd
from shadowline.control.membership import Membership
from shadowline.control.membership_store import MembershipStore


def store(etcd: Etcd, replica: int = 0) -> MembershipStore:
    return MembershipStore(etcd, Keys("unit", replica))


FIRST = Membership(0, 1, ("node0", "node1"))


def test_the_first_membership_is_created_once(etcd: Etcd):
    replica = store(etcd)
    assert replica.read() == (None, 0)
    assert replica.create(FIRST)
    assert not replica.create(Membership(0, 1, ("node1", "node0")))  # Ansible again, or a second driver
    membership, revision = replica.read()
    assert membership == FIRST and revision > 0
    with pytest.raises(ValueError, match="first membership is epoch 1, not 2"):
        store(etcd, 1).create(Membership(1, 2, ("node2", "node3")))


def test_of_drivers_racing_from_one_epoch_exactly_one_writes_the_next(etcd: Etcd):
    replica = store(etcd)
    replica.create(FIRST)
    current, revision = replica.read()
    won: list[str] = []

    def driver(spare: str) -> None:
        if replica.advance(current, revision, current.replaced({"node1": spare})):
            won.append(spare)

    threads = [threading.Thread(target=driver, args=(f"spare{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    assert replica.read()[0] == Membership(0, 2, ("node0", won[0]))


def test_a_driver_that_read_an_older_epoch_is_refused_and_reads_again(etcd: Etcd):
    replica = store(etcd)
    replica.create(FIRST)
    stale, stale_revision = replica.read()  # a driver reads epoch 1, then is cut off
    assert replica.advance(stale, stale_revision, stale.replaced({"node1": "node4"}))  # another relocates
    assert not replica.advance(stale, stale_revision, stale.replaced({"node1": "node5"}))  # the stale one, back
    now, revision = replica.read()
    assert now == Membership(0, 2, ("node0", "node4"))
    assert replica.advance(now, revision, now.replaced({"node0": "node5"}))
    assert replica.read()[0] == Membership(0, 3, ("node5", "node4"))


@pytest.mark.parametrize(("new", "message"), [
    (Membership(0, 3, ("node0", "node4")), "followed by epoch 2 of the same replica, not epoch 3 of replica 0"),
    (Membership(0, 1, ("node0", "node4")), "followed by epoch 2 of the same replica, not epoch 1 of replica 0"),
    (Membership(1, 2, ("node0", "node4")), "replica 1's membership is not replica 0's to write"),
])
def test_only_the_next_epoch_of_the_same_replica_is_written(etcd: Etcd, new: Membership, message: str):
    replica = store(etcd)
    replica.create(FIRST)
    current, revision = replica.read()
    with pytest.raises(ValueError, match=message):
        replica.advance(current, revision, new)
    assert replica.read() == (current, revision)


def test_a_spare_is_claimed_once_whichever_replicas_race(etcd: Etcd):
    won: list[int] = []

    def relocate(replica: int) -> None:
        if store(etcd, replica).claim("node4", 2):
            won.append(replica)

    threads = [threading.Thread(target=relocate, args=(q,)) for q in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    assert store(etcd).claim_of("node4") == (won[0], 2)
    assert store(etcd).claim_of("node5") is None


@pytest.mark.parametrize(("value", "why"), [
    (b"{not json", "not JSON"),
    (b'{"schema": 1, "replica": 0, "epoch": 0, "members": ["node0"]}', "epoch is 0"),
    (b'{"schema": 1, "replica": 1, "epoch": 1, "members": ["node0"]}', "the membership of replica 1 is under replica 0"),
    (b'{"schema": 9, "replica": 0, "epoch": 1, "members": ["node0"]}', "schema 9 is newer"),
])
def test_a_broken_record_is_refused_naming_why(etcd: Etcd, value: bytes, why: str):
    etcd.put(Keys("unit", 0).membership(), value)
    with pytest.raises(RecordInvalid, match=why):
        store(etcd).read()


def test_a_broken_claim_is_refused_naming_why(etcd: Etcd):
    etcd.put(Keys("unit", 0).spare_claim("node4"), b'{"replica": "one"}')
    with pytest.raises(RecordInvalid, match="the claim of node4 is"):
        store(etcd).claim_of("node4")


def test_a_membership_is_a_replicas():
    with pytest.raises(ValueError, match="give Keys a replica"):
        MembershipStore(Etcd("http://127.0.0.1:1"), Keys("unit", None))
