"""A replica's membership record and the spare nodes' claims in etcd (issue #40; docs/fleet-design.md, "Records in
etcd" and "Membership, epochs and fencing: the rules"). Not read by the agents yet: the decisions that use them are
control/membership.py's, table-tested; this module is the records' one reader and writer.

- ``replicas/<q>/membership`` (``Membership``): created once at epoch 1 (``create``: only where no record is), then
  changed only by compare-and-swap on the revision it was read at, and only to the next epoch of the same replica
  (``advance``): two drivers that both read epoch E can never both write E+1, and a driver that read an older
  epoch (a stale one, back from a partition) is refused and reads again.
- ``spares/<host>/claim`` (``{replica, epoch}``): a spare taken by a relocation, created once (``claim``): two
  replicas relocating at once never take the same spare; the loser tries the next one.

A record that cannot be read raises RecordInvalid naming why (as every record of the agents: reported, never acted
on); etcd's errors are the caller's (EtcdError).
"""

from __future__ import annotations

import json

from ..common.coordination import Keys, RecordInvalid, is_int
from ..common.etcd_client import Etcd
from .membership import Membership


class MembershipStore:
    def __init__(self, etcd: Etcd, keys: Keys) -> None:
        if keys.replica is None:
            raise ValueError("a membership is a replica's: give Keys a replica")
        self.etcd = etcd
        self.keys = keys

    def read(self) -> tuple[Membership | None, int]:
        """The record and the revision a swap must name (None and 0 where there is none)."""
        kv = self.etcd.get(self.keys.membership())
        if kv is None:
            return None, 0
        membership = Membership.parse(kv.value)
        if membership.replica != self.keys.replica:
            raise RecordInvalid(f"the membership of replica {membership.replica} is under replica "
                                f"{self.keys.replica}'s key")
        return membership, kv.mod_revision

    def create(self, first: Membership) -> bool:
        """The replica's first membership (epoch 1: the plan's order), unless a record is there already."""
        self._own(first)
        if first.epoch != 1:
            raise ValueError(f"a replica's first membership is epoch 1, not {first.epoch}")
        return self.etcd.txn_put_if_absent(self.keys.membership(), first.to_json())

    def advance(self, current: Membership, revision: int, new: Membership) -> bool:
        """Write ``new`` (the next epoch of ``current``) if the record is still the one read at ``revision``;
        False when another writer came first (read again)."""
        self._own(new)
        if new.replica != current.replica or new.epoch != current.epoch + 1:
            raise ValueError(f"epoch {current.epoch} of replica {current.replica} is followed by epoch "
                             f"{current.epoch + 1} of the same replica, not epoch {new.epoch} of replica {new.replica}")
        return self.etcd.txn_compare_and_swap(self.keys.membership(), revision, new.to_json())

    def claim(self, spare: str, epoch: int) -> bool:
        """Take ``spare`` for this replica's ``epoch``; False when it was taken already (by any replica)."""
        record = json.dumps({"replica": self.keys.replica, "epoch": epoch}, sort_keys=True)
        return self.etcd.txn_put_if_absent(self.keys.spare_claim(spare), record)

    def claim_of(self, spare: str) -> tuple[int, int] | None:
        """(replica, epoch) that took ``spare``, None while it is free."""
        kv = self.etcd.get(self.keys.spare_claim(spare))
        if kv is None:
            return None
        try:
            data = json.loads(kv.value)
        except (ValueError, UnicodeDecodeError) as err:
            raise RecordInvalid(f"the claim of {spare} is not JSON ({err})") from None
        if not (isinstance(data, dict) and is_int(data.get("replica")) and is_int(data.get("epoch"))):
            raise RecordInvalid(f"the claim of {spare} is {data!r}, not {{replica, epoch}}")
        return data["replica"], data["epoch"]

    def _own(self, membership: Membership) -> None:
        if membership.replica != self.keys.replica:
            raise ValueError(f"replica {membership.replica}'s membership is not replica {self.keys.replica}'s to write")
