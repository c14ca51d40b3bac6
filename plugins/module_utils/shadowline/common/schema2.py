"""Schema 2's records moved to replica 0 (record schema 3: common/coordination.py, docs/fleet-design.md).

Until schema 3 a deployment's records lived directly under its prefix: ``slots/``, ``gone/``, ``ranks/``,
``active`` and ``paused``. A deployment that ran schema 2 has one replica, replica 0, so each of them moves to the
same path under ``replicas/0/``; a node's own records (``agents/``, ``gms_lost/``, ``fenced/``) stay where they
are. Every agent of replica 0 moves them before its first view (control/feed.py), so that no rank is adopted
against a slot that is not there yet, and any number of agents may do it at once: a record is copied only over an
absent or older copy (a lower mod revision: written before it) and deleted only if nobody wrote it since it was
read. An older agent still running in the seconds of a rolling upgrade may write a record of schema 2 again; the
next agent to start moves it over (the later write wins, as it would have in one place).
"""

from __future__ import annotations

from dataclasses import dataclass

from .coordination import Keys
from .etcd_client import Etcd

PREFIXES = ("slots/", "gone/", "ranks/")  # schema 2's record trees under the deployment's prefix
SINGLE = ("active", "paused")  # and its single records


@dataclass(frozen=True)
class Moved:
    copied: tuple[str, ...]  # the records written under replica 0 (their paths below the prefix)
    removed: int  # schema 2's records deleted (copied now, or an older copy of one already there)


def move_schema2(etcd: Etcd, keys: Keys) -> Moved:
    """Move the deployment's schema 2 records under ``keys``' replica, which must be replica 0 (raises EtcdError
    when etcd does not answer; a later call finishes what an interrupted one left)."""
    if keys.replica != 0:
        raise ValueError(f"schema 2's records are replica 0's, not replica {keys.replica}'s")
    base = keys.deployment_root
    read, _revision = etcd.read_at_once([base + p for p in PREFIXES] + [keys.root], [base + k for k in SINGLE])
    copies = {kv.key: kv for kv in read if kv.key.startswith(keys.root)}  # replica 0's, as of the same read
    copied, removed = [], 0
    for kv in (kv for kv in read if not kv.key.startswith(keys.root)):
        path = kv.key[len(base):]
        target = keys.root + path
        current = copies.get(target)
        if current is None or current.mod_revision < kv.mod_revision:
            if etcd.txn_compare_and_swap(target, current.mod_revision if current else 0, kv.value):
                copied.append(path)
        removed += etcd.txn_delete_if_unchanged(kv.key, kv.mod_revision)
    return Moved(tuple(copied), removed)
