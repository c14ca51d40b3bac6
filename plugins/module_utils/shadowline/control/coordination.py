"""How the node agents agree, through the deployment's etcd (no consensus of our own).

Keys, under ``/shadowline/<deployment>/``:

- ``agents/<host>``: an agent's presence, on its lease; gone when the agent is gone for a lease TTL.
- ``slots/<cohort>``: the cohort slot's record (``Slot``): its generation and state. Every state change is a
  compare-and-swap on the key's mod revision, so two agents can never both declare a generation failed or
  both relaunch it.
- ``gone/<cohort>/<generation>/<host>``: an agent's confirmation that its ranks of that generation are gone.
- ``active``: the serving cohort and generation, recorded when a promotion is verified.
- ``gms_lost/<host>``: a node whose GMS server died (its weights are no longer resident for new imports).

Slot states: ``running`` (the generation's ranks run), ``failed`` (declared failed: every agent kills its
ranks of that generation), ``launching`` (every agent starts its rank of the new generation, not before
``not_before``), ``dead`` (crash loop: given up, needs an operator).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .etcd_client import KV, Etcd

RUNNING, FAILED, LAUNCHING, DEAD = "running", "failed", "launching", "dead"


@dataclass
class Slot:
    cohort: int
    generation: int
    state: str
    reason: str = ""
    since: float = field(default_factory=time.time)
    attempts: int = 0  # consecutive failed launches (reset once a generation has run for a while)
    not_before: float = 0.0  # launching: start ranks no earlier than this (backoff)
    detected_by: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_kv(cls, kv: KV) -> "Slot":
        return cls(**json.loads(kv.value))


class Keys:
    def __init__(self, deployment: str) -> None:
        self.root = f"/shadowline/{deployment}/"

    def agent(self, host: str) -> str:
        return f"{self.root}agents/{host}"

    def agents(self) -> str:
        return f"{self.root}agents/"

    def slot(self, cohort: int) -> str:
        return f"{self.root}slots/{cohort}"

    def slots(self) -> str:
        return f"{self.root}slots/"

    def gone(self, cohort: int, generation: int, host: str | None = None) -> str:
        base = f"{self.root}gone/{cohort}/{generation}/"
        return base + host if host else base

    def active(self) -> str:
        return f"{self.root}active"

    def gms_lost(self, host: str | None = None) -> str:
        return f"{self.root}gms_lost/{host}" if host else f"{self.root}gms_lost/"


class Coordination:
    """Slot transitions as etcd transactions."""

    def __init__(self, etcd: Etcd, deployment: str) -> None:
        self.etcd = etcd
        self.keys = Keys(deployment)

    def slot(self, cohort: int) -> tuple[Slot | None, int]:
        """The slot record and its mod revision (0 when absent)."""
        kv = self.etcd.get(self.keys.slot(cohort))
        return (Slot.from_kv(kv), kv.mod_revision) if kv else (None, 0)

    def slots(self) -> dict[int, tuple[Slot, int]]:
        result = {}
        for kv in self.etcd.get_prefix(self.keys.slots()):
            slot = Slot.from_kv(kv)
            result[slot.cohort] = (slot, kv.mod_revision)
        return result

    def create_slot(self, slot: Slot) -> bool:
        return self.etcd.txn_put_if_absent(self.keys.slot(slot.cohort), slot.to_json())

    def swap(self, slot: Slot, mod_revision: int) -> bool:
        """Write ``slot`` only if nobody changed the key since ``mod_revision``."""
        return self.etcd.txn_compare_and_swap(self.keys.slot(slot.cohort), mod_revision, slot.to_json())

    def declare_failed(self, cohort: int, generation: int, reason: str, host: str) -> Slot | None:
        """Mark generation failed, once: returns the new record when this call did it, else None."""
        current, revision = self.slot(cohort)
        if current is None or current.generation != generation or current.state not in (RUNNING, LAUNCHING):
            return None
        failed = Slot(cohort=cohort, generation=generation, state=FAILED, reason=reason, attempts=current.attempts,
                      detected_by=host)
        return failed if self.swap(failed, revision) else None

    def confirm_gone(self, cohort: int, generation: int, host: str, when: float) -> None:
        self.etcd.put(self.keys.gone(cohort, generation, host), json.dumps({"time": when}))

    def gone_hosts(self, cohort: int, generation: int) -> dict[str, float]:
        prefix = self.keys.gone(cohort, generation)
        return {kv.key[len(prefix):]: json.loads(kv.value)["time"] for kv in self.etcd.get_prefix(prefix)}

    def live_agents(self) -> set[str]:
        prefix = self.keys.agents()
        return {kv.key[len(prefix):] for kv in self.etcd.get_prefix(prefix)}

    def record_active(self, cohort: int, generation: int) -> None:
        self.etcd.put(self.keys.active(), json.dumps({"cohort": cohort, "generation": generation,
                                                      "since": time.time()}))

    def active(self) -> dict[str, Any] | None:
        kv = self.etcd.get(self.keys.active())
        return json.loads(kv.value) if kv else None
