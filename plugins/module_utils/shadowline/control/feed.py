"""The agent's reading side of etcd, in a thread of its own so that a slow or absent etcd never holds up the loop
(the loop kills local ranks at once and writes to etcd only when it has something to say).

The feed keeps the agent's presence (``agents/<host>`` on a lease, presence.py) in a thread of its own, so that a
slow answer to a read never lets the lease expire, and in another it watches its
replica's prefix and reads its view (one transaction, view.py) when the watch says something changed or every
``period_s``. The loop takes what arrived with ``take()``: the latest view, the slot records the
watch delivered since (the hot path: a declared failure is torn down from the event itself), whether etcd
answers, and notices for the event log.

Before its first view, an agent of replica 0 moves schema 2's records there (common/schema2.py): a deployment
upgraded from it finds its slots where its agents now read them.

A watch whose revision etcd compacted away is cancelled by etcd; the feed then reads the view again and watches on
from its revision (nothing is missed: the view holds every key as of that revision).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..common.coordination import Keys, RecordInvalid, Slot
from ..common.etcd_client import Etcd, EtcdError
from ..common.schema2 import move_schema2
from ..common.wakeup import wake
from .presence import Presence
from .view import DeploymentView, read_view

RETRY_S = 0.2  # after a failed call, wait this long before the next


@dataclass(frozen=True)
class Notice:
    """Something the feed saw that belongs in the event log (the loop writes it)."""
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class FeedNews:
    """What arrived since the loop last took it."""
    view: DeploymentView | None = None  # the latest view, None when none was read since
    slots: list[Slot] = field(default_factory=list)  # slot records the watch delivered, in order
    notices: list[Notice] = field(default_factory=list)
    lost_since: float | None = None  # monotonic: etcd has not answered since then; None while it answers


class EtcdFeed:
    def __init__(self, etcd: Etcd, keys: Keys, host: str, members: tuple[str, ...], cohorts: frozenset[int],  # noqa: PLR0913 (over the size limits of pyproject.toml; split it when it changes next)
                 lease_ttl_s: int, period_s: float, wake_fd: int, lease_etcd: Etcd | None = None,
                 instance: str = "") -> None:
        self.etcd = etcd
        self.keys = keys
        self.host = host
        self.members = members  # the replica's nodes: the view reads their own records (presence, GMS, fence)
        self.cohorts = cohorts
        self.period_s = period_s
        self.wake_fd = wake_fd
        self.stop = threading.Event()
        # the agent's presence, named by its instance (coordination.agent_instance), on its own client
        self.presence = Presence(lease_etcd or etcd, keys.agent(host), lease_ttl_s, instance, self.notice, self.stop)
        self.revision = 0  # the watch continues after it; 0: read the view first
        self.next_read = 0.0
        self._lock = threading.Lock()
        self._news = FeedNews()
        self.schema2_moved = keys.replica != 0  # replica 0's agents move schema 2's records before the first view

    def start(self) -> threading.Thread:
        self.presence.start()
        thread = threading.Thread(target=self.run, name="etcd-feed", daemon=True)
        thread.start()
        return thread

    def take(self) -> FeedNews:
        with self._lock:
            news, self._news = self._news, FeedNews(lost_since=self._news.lost_since)
        return news

    # --- the thread ---------------------------------------------------------------------------------------------
    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.step()
                self.answered()
            except EtcdError as err:
                if err.compacted:
                    self.notice("watch-resync", revision=self.revision, compacted=err.compacted)
                    self.revision = 0  # read the whole view again, then watch on from its revision
                    continue
                self.unanswered(err)
                self.stop.wait(RETRY_S)
            except Exception as err:  # noqa: BLE001 (the feed must outlive anything one call does)
                self.notice("feed-error", error=repr(err))
                self.stop.wait(RETRY_S)

    def step(self) -> None:
        now = time.monotonic()
        if self.revision == 0 or now >= self.next_read:
            self.read()
        timeout = self.next_read - time.monotonic()
        events = self.etcd.watch(self.keys.root, self.revision, timeout=max(0.05, min(1.0, timeout)))
        if not events:
            return
        self.revision = max(e.mod_revision for e in events)
        slots = []
        for change in events:
            if change.type == "put" and change.key.startswith(self.keys.slots()):
                try:
                    slots.append(Slot.parse(change.value))
                except RecordInvalid:
                    pass  # the view that follows names it (view.invalid) and the loop reports it
        with self._lock:
            self._news.slots += [s for s in slots if s.cohort in self.cohorts]
        self.next_read = 0.0  # something changed: read the view at once
        self.wake()

    def read(self) -> None:
        if not self.schema2_moved:
            moved = move_schema2(self.etcd, self.keys)
            self.schema2_moved = True
            if moved.copied or moved.removed:
                self.notice("records-moved", copied=len(moved.copied), removed=moved.removed,
                            to=self.keys.root, records=list(moved.copied[:20]))
        view = read_view(self.etcd, self.keys, self.cohorts, self.members)
        self.revision = view.revision
        self.next_read = time.monotonic() + self.period_s
        with self._lock:
            self._news.view = view
        self.wake()

    # --- bookkeeping ----------------------------------------------------------------------------------------------
    def answered(self) -> None:
        with self._lock:
            lost = self._news.lost_since
            self._news.lost_since = None
        if lost is not None:
            self.notice("etcd-reachable", after_s=round(time.monotonic() - lost, 3))

    def unanswered(self, err: EtcdError) -> None:
        with self._lock:
            first = self._news.lost_since is None
            if first:
                self._news.lost_since = time.monotonic()
        if first:
            self.notice("etcd-unreachable", error=str(err))

    def notice(self, event: str, **fields: Any) -> None:
        with self._lock:
            self._news.notices.append(Notice(event, fields))
        self.wake()

    def wake(self) -> None:
        wake(self.wake_fd, b"f")
