"""A replica's membership decisions (control/membership.py) against the table of docs/fleet-design.md: partitions,
late messages, returning nodes, a lost leader, an empty spare pool, two nodes lost at once; and the record's
parsing. Pure functions: no etcd, no process."""

from __future__ import annotations

import pytest

from shadowline.common.coordination import RecordInvalid
from shadowline.control.membership import (
    DeclareNodeLost,
    HoldDown,
    KillStale,
    Membership,
    Relocate,
    Retire,
    SelfFence,
    driver_of,
    membership_check,
    relocation_due,
    self_fence_due,
    stale_epoch,
)

E3 = Membership(replica=1, epoch=3, members=("node2", "node3", "node4", "node5"))
EVERYONE = frozenset(E3.members)
SPARES = ("spare0", "spare1")


def test_a_membership_round_trips_and_its_next_epoch_keeps_the_ranks():
    assert Membership.parse(E3.to_json()) == E3
    moved = E3.replaced({"node3": "spare0"})
    assert moved == Membership(1, 4, ("node2", "spare0", "node4", "node5"))
    assert (moved.rank_of("spare0"), moved.rank_of("node3")) == (1, None)


@pytest.mark.parametrize(("raw", "says"), [
    (b"{", "not JSON"),
    (b"[]", "not a JSON object"),
    (b'{"replica": 0, "epoch": 1, "members": ["a"]}', "schema is None"),
    (b'{"schema": 2, "replica": 0, "epoch": 1, "members": ["a"]}', "newer than this agent's"),
    (b'{"schema": 1, "replica": 0, "epoch": 1, "members": ["a"], "spare": "b"}', "fields ['spare']"),
    (b'{"schema": 1, "replica": -1, "epoch": 1, "members": ["a"]}', "replica is -1"),
    (b'{"schema": 1, "replica": 0, "epoch": 0, "members": ["a"]}', "epoch is 0"),
    (b'{"schema": 1, "replica": 0, "epoch": true, "members": ["a"]}', "epoch is True"),
    (b'{"schema": 1, "replica": 0, "epoch": 1, "members": []}', "not a list of node names"),
    (b'{"schema": 1, "replica": 0, "epoch": 1, "members": ["a", ""]}', "not a list of node names"),
    (b'{"schema": 1, "replica": 0, "epoch": 1, "members": ["a", "a"]}', "name a node twice"),
])
def test_a_broken_record_is_refused_naming_what_is_wrong(raw: bytes, says: str):
    with pytest.raises(RecordInvalid) as err:
        Membership.parse(raw)
    assert says in str(err.value), str(err.value)
    assert err.value.newer == ("newer" in says)


# --- the driver's decision ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("case", "leased", "fatal", "suspect", "spares", "held", "expected"), [
    ("all well", EVERYONE, set(), {}, SPARES, set(), []),
    ("a node's lease expired, a spare is free: claim it and move the rank under the next epoch",
     EVERYONE - {"node4"}, set(), {}, SPARES, set(),
     [Relocate(E3, Membership(1, 4, ("node2", "node3", "spare0", "node5")), (("node4", "spare0", "lease expired"),))]),
    ("its notice connection failed, its lease still held: tear the replica down, keep its place",
     EVERYONE, set(), {"node4": "notice unsent"}, SPARES, set(), [DeclareNodeLost("node4", "notice unsent")]),
    ("the same, and its keepalive lands again: nothing more (a relaunch on the same members follows the teardown)",
     EVERYONE, set(), {}, SPARES, set(), []),
    ("a fatal Xid: the node fenced itself and says so, relocate without waiting for its lease",
     EVERYONE, {"node3"}, {}, SPARES, set(),
     [Relocate(E3, Membership(1, 4, ("node2", "spare0", "node4", "node5")), (("node3", "spare0", "fatal fault"),))]),
    ("the leader node lost: a spare takes rank 0, the master address and the lock move with it",
     EVERYONE - {"node2"}, set(), {}, SPARES, set(),
     [Relocate(E3, Membership(1, 4, ("spare0", "node3", "node4", "node5")), (("node2", "spare0", "lease expired"),))]),
    ("two nodes lost at once: one new epoch, each onto its own spare, in rank order",
     EVERYONE - {"node3", "node5"}, set(), {}, SPARES, set(),
     [Relocate(E3, Membership(1, 4, ("node2", "spare0", "node4", "spare1")),
               (("node3", "spare0", "lease expired"), ("node5", "spare1", "lease expired")))]),
    ("the spare pool is empty: the replica is held down, said once per node",
     EVERYONE - {"node4"}, set(), {}, (), set(), [HoldDown("node4", "no spare: 0 free for 1 lost node(s) (lease expired)")]),
    ("held down already: not said again", EVERYONE - {"node4"}, set(), {}, (), {"node4"}, []),
    ("fewer spares than lost nodes: none moves (a replica is whole or down)",
     EVERYONE - {"node3", "node5"}, set(), {}, ("spare0",), set(),
     [HoldDown("node3", "no spare: 1 free for 2 lost node(s) (lease expired)"),
      HoldDown("node5", "no spare: 1 free for 2 lost node(s) (lease expired)")]),
    ("a spare listed that is already a member (a stale pool) is not taken twice",
     EVERYONE - {"node4"}, set(), {}, ("node5", "spare1"), set(),
     [Relocate(E3, Membership(1, 4, ("node2", "node3", "spare1", "node5")), (("node4", "spare1", "lease expired"),))]),
    ("a suspect of another replica is not this driver's", EVERYONE, set(), {"node9": "stalled"}, SPARES, set(), []),
])
def test_the_driver_decides_relocation(case: str, leased: frozenset, fatal: set, suspect: dict, spares: tuple,
                                       held: set, expected: list):
    assert relocation_due(E3, frozenset(leased), frozenset(fatal), suspect, spares, frozenset(held)) == expected, case


@pytest.mark.parametrize(("leased", "driver"), [
    (EVERYONE, "node2"),
    (EVERYONE - {"node2"}, "node3"),  # the leader lost: rank 1's agent drives, relocates rank 0
    (frozenset({"node5"}), "node5"),
    (frozenset(), None),
])
def test_the_driver_is_the_lowest_ranked_member_with_a_live_lease(leased: frozenset, driver: str | None):
    assert driver_of(E3, leased) == driver


# --- a node's own decisions -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("case", "host", "running", "expected"), [
    ("a member running the current epoch", "node3", {0: 3, 1: 3}, []),
    ("a member with a rank of an older epoch (a late launch)", "node3", {0: 3, 1: 2}, [KillStale((1,), 3)]),
    ("a partitioned node back after its rank was relocated: not a member, not a spare", "node9", {0: 2},
     [Retire("node9", 3)]),
    ("a lost node back with nothing running: it still retires, fenced", "node9", {}, [Retire("node9", 3)]),
    ("a spare runs no rank of the replica", "spare0", {}, []),
    ("a spare left with a rank (a claim given back) kills it", "spare0", {1: 3}, [KillStale((1,), 3)]),
])
def test_a_node_checks_its_membership(case: str, host: str, running: dict, expected: list):
    assert membership_check(E3, host, frozenset(SPARES), running) == expected, case


TTL = 2.0


@pytest.mark.parametrize(("case", "sent", "now", "fences"), [
    ("renewed just now", 100.0, 100.2, False),
    ("the partition began: no keepalive answered for 0.9 s, 0.1 s before the margin", 100.0, 100.9, False),
    ("a margin before etcd may expire the lease: the ranks go", 100.0, 101.0, True),
    ("long after", 100.0, 130.0, True),
    ("never renewed yet: nothing runs to fence", None, 130.0, False),
])
def test_a_partitioned_node_fences_itself_before_its_lease_can_expire(case: str, sent: float | None, now: float,
                                                                      fences: bool):
    fence = self_fence_due(TTL, sent, now)
    assert (fence is not None) == fences, case
    if fence:
        assert isinstance(fence, SelfFence) and "lease TTL 2 s" in fence.reason


@pytest.mark.parametrize(("ttl", "margin"), [(0.0, 0.0), (2.0, 2.0), (2.0, -0.1), (float("nan"), 1.0),
                                             (float("inf"), 1.0), (2.0, float("nan"))])
def test_a_lease_and_margin_that_make_no_sense_are_refused(ttl: float, margin: float):
    with pytest.raises(ValueError, match="a positive TTL and a margin below it"):
        self_fence_due(ttl, 0.0, 1.0, margin)


def test_the_fence_always_comes_before_the_relocation():
    """The partition, on both clocks: the node fences at sent + TTL - margin on its clock; etcd can expire the
    lease at sent + TTL at the earliest, and only then may the driver relocate (its lease is gone from ``leased``)."""
    sent = 50.0
    first_fence = next(t / 100 for t in range(5000, 6000) if self_fence_due(TTL, sent, t / 100))
    earliest_expiry = sent + TTL
    assert first_fence < earliest_expiry
    assert relocation_due(E3, EVERYONE, frozenset(), {}, SPARES, frozenset()) == []  # lease alive: no move yet


@pytest.mark.parametrize(("epoch", "late"), [(2, True), (3, False), (4, False)])
def test_a_late_message_of_an_older_epoch_counts_for_that_epoch_only(epoch: int, late: bool):
    assert stale_epoch(E3, epoch) is late
