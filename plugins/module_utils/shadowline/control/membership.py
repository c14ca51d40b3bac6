"""A replica's membership (issue #40, docs/fleet-design.md "Membership, epochs and fencing: the rules"): which node
runs each rank, under which epoch, and the decisions about it, as pure functions of what an agent knows at one
tick. Nothing here reads etcd or runs a process: an agent carries the actions out (the record's compare-and-swap,
a spare's claim, its own ranks' kill), and tests/unit/test_membership.py holds the table of situations the design
names (partitions, late messages, returning nodes, lost leaders, an empty spare pool).

The rules these functions keep:

- **Every rank belongs to an epoch.** The membership record names the replica's nodes in rank order under an
  epoch; a node runs ranks of the current epoch only, and only if it is a member (``membership_check``).
- **Membership changes only by compare-and-swap, by the replica's driver, once the old epoch is dead there**: a
  member whose node lease expired, or that reported a fatal fault itself, is replaced by a spare in its own rank's
  place under the next epoch (``relocation_due``); a member that only looks lost (a failure notice unsent, its ranks
  stalled) while its lease lives has its replica's cohorts torn down, and keeps its place.
- **A node that cannot renew its lease fences itself first** (``self_fence_due``): its ranks are killed before etcd
  can let the lease expire, so a relocated rank never runs twice.
- **The driver is the lowest-ranked member whose lease lives** (``driver_of``): a lost leader's place is taken by
  a spare at rank 0, and the driver moves to it once its agent runs.
- **A lost node never rejoins by itself**: not a member and not a spare, it kills what it runs and idles, fenced.

This module is the oracle; the agent's wiring (the record in etcd, the leases, the spares' claims) is issue #40's
next step.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Union

from ..common.coordination import RecordInvalid, is_int, versioned_record

MEMBERSHIP_SCHEMA = 1
FENCE_MARGIN_S = 1.0  # a node kills its ranks this long before etcd may expire its lease (a kill takes 0.05-0.4 s)


@dataclass(frozen=True)
class Membership:
    """A replica's nodes in rank order (``members[0]`` leads: the master address, the failover lock) under an epoch;
    the epoch only grows, by one per change."""
    replica: int
    epoch: int
    members: tuple[str, ...]

    def rank_of(self, host: str) -> int | None:
        return self.members.index(host) if host in self.members else None

    def replaced(self, lost: dict[str, str]) -> Membership:
        """The next epoch with each lost node (a key) replaced by its spare (the value), in the lost node's rank."""
        return Membership(self.replica, self.epoch + 1, tuple(lost.get(h, h) for h in self.members))

    def to_json(self) -> str:
        return json.dumps({"schema": MEMBERSHIP_SCHEMA, "replica": self.replica, "epoch": self.epoch,
                           "members": list(self.members)}, sort_keys=True)

    @classmethod
    def parse(cls, value: bytes | str) -> Membership:
        """The record, or RecordInvalid naming what is wrong (as every record of the agents: reported, never acted
        on)."""
        data = versioned_record(value, MEMBERSHIP_SCHEMA)
        schema = data["schema"]
        unknown = sorted(set(data) - {"schema", "replica", "epoch", "members"})
        if unknown:
            raise RecordInvalid(f"fields {unknown} are not in schema {schema}")
        for name, least in (("replica", 0), ("epoch", 1)):
            if not (is_int(data.get(name)) and data[name] >= least):
                raise RecordInvalid(f"{name} is {data.get(name)!r}, not a whole number of at least {least}")
        members = data.get("members")
        if not (isinstance(members, list) and members and all(isinstance(m, str) and m for m in members)):
            raise RecordInvalid(f"members is {members!r}, not a list of node names")
        if len(set(members)) != len(members):
            raise RecordInvalid(f"members {members} name a node twice")
        return cls(data["replica"], data["epoch"], tuple(members))


# --- actions ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SelfFence:
    """Kill every rank this node runs and start none until the lease is renewed and the membership read again."""
    reason: str


@dataclass(frozen=True)
class Retire:
    """This node is not in its replica's current membership and not a spare (a lost node back after a partition
    or a reboot): kill what it runs, write its ``fenced`` record, idle until ``shadowline unfence``."""
    host: str
    epoch: int


@dataclass(frozen=True)
class KillStale:
    """This node's ranks of an older epoch: kill them (their cohort is relaunched under the current one)."""
    cohorts: tuple[int, ...]
    epoch: int


@dataclass(frozen=True)
class DeclareNodeLost:
    """A member looks lost while its lease lives: tear the replica's cohorts down on every node now (the frontend
    routes to the other replicas); its place is kept until its lease expires or it comes back."""
    host: str
    signal: str


@dataclass(frozen=True)
class Relocate:
    """Claim each spare (create-if-absent: a spare is claimed once), then compare-and-swap the membership from
    ``old`` to ``new`` and launch every cohort of the replica under the new epoch."""
    old: Membership
    new: Membership
    moved: tuple[tuple[str, str, str], ...]  # (lost node, spare, why) per rank moved


@dataclass(frozen=True)
class HoldDown:
    """A member is lost and no spare is free: the replica stays down (the other replicas serve), said once."""
    host: str
    reason: str


Action = Union[SelfFence, Retire, KillStale, DeclareNodeLost, Relocate, HoldDown]


# --- decisions --------------------------------------------------------------------------------------------------
def self_fence_due(ttl_s: float, last_renewal_sent: float | None, now: float,
                   margin_s: float = FENCE_MARGIN_S) -> SelfFence | None:
    """A node's own lease, on its own monotonic clock: ``last_renewal_sent`` is when it sent the last keepalive
    etcd answered (etcd granted the TTL after that send, so it cannot expire the lease before
    ``last_renewal_sent + ttl_s`` on this clock). The ranks go ``margin_s`` before that; None while there is time,
    or before the first renewal (nothing runs then)."""
    if not (math.isfinite(ttl_s) and ttl_s > 0 and math.isfinite(margin_s) and 0 <= margin_s < ttl_s):
        raise ValueError(f"ttl_s {ttl_s!r} and margin_s {margin_s!r}: a positive TTL and a margin below it")
    if last_renewal_sent is None:
        return None
    deadline = last_renewal_sent + ttl_s - margin_s
    if now < deadline:
        return None
    left = ttl_s - (now - last_renewal_sent)
    when = f"{left:.2f} s from now" if left > 0 else "already"
    return SelfFence(f"no keepalive answered for {now - last_renewal_sent:.2f} s (lease TTL {ttl_s:g} s): etcd may "
                     f"let the lease expire {when}")


def membership_check(membership: Membership, host: str, spares: frozenset[str],
                     running: dict[int, int]) -> list[Action]:
    """What this node does with the ranks it runs (``running``: cohort -> the epoch it was started under): a
    member kills its ranks of other epochs; a spare runs no rank of this replica; anyone else retires."""
    if membership.rank_of(host) is None:
        if host in spares:
            stale = tuple(sorted(running))
            return [KillStale(stale, membership.epoch)] if stale else []
        return [Retire(host, membership.epoch)]
    stale = tuple(sorted(c for c, epoch in running.items() if epoch != membership.epoch))
    return [KillStale(stale, membership.epoch)] if stale else []


def driver_of(membership: Membership, leased: frozenset[str]) -> str | None:
    """The node whose agent drives the replica: the lowest-ranked member whose lease lives (None: none does)."""
    return next((h for h in membership.members if h in leased), None)


def relocation_due(membership: Membership, leased: frozenset[str], fatal: frozenset[str],
                   suspect: dict[str, str], spares: tuple[str, ...], held: frozenset[str]) -> list[Action]:
    """The driver's decision about its replica's nodes at one tick.

    ``leased``: nodes whose agent lease lives (etcd deletes the key when it expires); ``fatal``: members that said
    themselves their node needs service (a fatal Xid: their ``gone`` records and fence written); ``suspect``: member
    -> the signal that says it may be lost while its lease still lives (a failure notice unsent, its ranks' progress
    stopped at the leader); ``spares``: the free spares in the order to take them; ``held``: members already said
    to be held down for want of a spare.

    A member is relocated when its lease expired or it reported a fatal fault: all such members at once, under one
    new epoch, each onto its own spare; when there are not enough spares none moves (a replica is whole or down)
    and each is held down, said once. A suspect with a live lease only has its replica torn down."""
    lost = [(h, "lease expired" if h not in leased else "fatal fault") for h in membership.members
            if h not in leased or h in fatal]
    free = [s for s in spares if s not in membership.members]
    actions: list[Action] = []
    if lost:
        if len(free) < len(lost):
            return [HoldDown(h, f"no spare: {len(free)} free for {len(lost)} lost node(s) ({why})")
                    for h, why in lost if h not in held]
        moved = tuple((h, spare, why) for (h, why), spare in zip(lost, free))
        actions.append(Relocate(membership, membership.replaced({h: s for h, s, _why in moved}), moved))
    lost_hosts = {h for h, _why in lost}
    actions += [DeclareNodeLost(h, signal) for h, signal in sorted(suspect.items())
                if h in membership.members and h not in lost_hosts]
    return actions


def stale_epoch(membership: Membership, epoch: int) -> bool:
    """Whether a message (a failure notice, a ``gone`` record, a rank's record) of ``epoch`` is late: it concerns
    an older membership, and counts for that epoch only."""
    return epoch < membership.epoch
