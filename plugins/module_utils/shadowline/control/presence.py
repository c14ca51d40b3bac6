"""An agent's presence in etcd: ``agents/<host>`` on a lease of its own, kept alive every third of its TTL and
registered again when it expired, in a thread of its own so that a slow answer to a read never lets it expire.

A node's agent keeps it through its feed (feed.py); a spare's agent (spare_agent.py) keeps it alone, with
``role: spare`` in the record. The record names the agent's pid, when it registered and its instance
(coordination.agent_instance); the replica's view reads the presence of its members (view.py), and a spare's
tells the fleet's drivers and status that it is there (docs/fleet-design.md).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..common.etcd_client import Etcd, EtcdError

RETRY_S = 0.2  # after a failed registration, wait this long before the next
SPARE = "spare"  # the role a spare's presence record names (a node's names none: older readers know it so)


class Presence:
    def __init__(self, etcd: Etcd, key: str, ttl_s: int, instance: str,  # noqa: PLR0913 (one record's settings)
                 notice: Callable[..., None], stop: threading.Event, role: str = "") -> None:
        self.etcd = etcd
        self.key = key
        self.ttl_s = ttl_s
        self.instance = instance
        self.notice = notice  # notice(event, **fields): for the event log
        self.stop = stop
        self.role = role
        self.lease = 0
        self.next_keepalive = 0.0
        # monotonic time at which the last grant or keepalive that etcd answered was sent: etcd cannot expire the
        # lease before this plus its TTL (a node's self-fencing deadline, membership.self_fence_due); 0: none yet
        self.answered_at = 0.0

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.keep, name="etcd-lease", daemon=True)
        thread.start()
        return thread

    def keep(self) -> None:
        """Registered, kept alive every third of its TTL, registered again if it expired."""
        while not self.stop.is_set():
            try:
                if not self.lease:
                    self.register()
                else:
                    self.keepalive()
            except EtcdError:
                pass  # the reading thread (or the spare's loop) reports whether etcd answers
            except Exception as err:  # noqa: BLE001 (the lease must outlive anything one call does)
                self.notice("lease-error", error=repr(err))
            self.stop.wait(max(0.05, self.next_keepalive - time.monotonic()) if self.lease else RETRY_S)

    def record(self) -> dict[str, Any]:
        presence: dict[str, Any] = {"pid": os.getpid(), "since": time.time(), "instance": self.instance}
        if self.role:
            presence["role"] = self.role
        return presence

    def register(self) -> None:
        sent = time.monotonic()
        lease = self.etcd.lease_grant(self.ttl_s)
        self.answered_at = sent
        self.etcd.put(self.key, json.dumps(self.record()), lease=lease)
        if self.lease:
            self.notice("agent-registered-again", lease=f"{lease:x}")
        self.lease = lease
        self.next_keepalive = time.monotonic() + self.period()

    def keepalive(self) -> None:
        sent = time.monotonic()
        self.next_keepalive = sent + self.period()
        if self.etcd.lease_keepalive(self.lease) <= 0:
            self.notice("agent-lease-expired")
            self.register()
        else:
            self.answered_at = sent

    def period(self) -> float:
        return max(0.2, self.ttl_s / 3)
