"""What the agent knows at one tick: one range read of the deployment's etcd prefix, parsed into a typed view,
and the clock. Decisions (node_duties.py, driver_duties.py) read only these, the node's observations and the
agent's memory; they never read etcd themselves."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from .coordination import Keys, Slot
from .etcd_client import KV, Etcd


@dataclass(frozen=True)
class Now:
    """The clock at a tick: ``wall`` for what is recorded or shared through etcd (slot times, events),
    ``mono`` for this agent's own deadlines."""
    wall: float
    mono: float

    @classmethod
    def read(cls) -> Now:
        return cls(wall=time.time(), mono=time.monotonic())


@dataclass(frozen=True)
class SlotEntry:
    slot: Slot
    revision: int  # the key's mod revision: the compare of the next compare-and-swap


@dataclass(frozen=True)
class Active:
    cohort: int
    generation: int
    since: float


@dataclass(frozen=True)
class DeploymentView:
    slots: dict[int, SlotEntry] = field(default_factory=dict)
    active: Active | None = None
    agents: frozenset[str] = frozenset()  # nodes whose agent holds its lease
    gms_lost: dict[str, str] = field(default_factory=dict)  # node -> its gms_lost key
    gone: dict[tuple[int, int], dict[str, float]] = field(default_factory=dict)  # (cohort, generation) -> node -> when

    def slot(self, cohort: int) -> Slot | None:
        entry = self.slots.get(cohort)
        return entry.slot if entry else None

    def gone_hosts(self, cohort: int, generation: int) -> dict[str, float]:
        return self.gone.get((cohort, generation), {})


def parse_view(keys: Keys, kvs: list[KV]) -> DeploymentView:
    """The typed view of the deployment's keys (see coordination.py); unknown or broken keys are skipped."""
    slots: dict[int, SlotEntry] = {}
    active: Active | None = None
    agents: set[str] = set()
    gms_lost: dict[str, str] = {}
    gone: dict[tuple[int, int], dict[str, float]] = {}
    for kv in kvs:
        if not kv.key.startswith(keys.root):
            continue
        parts = kv.key[len(keys.root):].split("/")
        try:
            if parts[0] == "slots" and len(parts) == 2:
                slot = Slot.from_kv(kv)
                slots[slot.cohort] = SlotEntry(slot, kv.mod_revision)
            elif parts[0] == "agents" and len(parts) == 2:
                agents.add(parts[1])
            elif parts[0] == "gms_lost" and len(parts) == 2:
                gms_lost[parts[1]] = kv.key
            elif parts[0] == "gone" and len(parts) == 4:
                gone.setdefault((int(parts[1]), int(parts[2])), {})[parts[3]] = float(json.loads(kv.value)["time"])
            elif parts == ["active"]:
                record = json.loads(kv.value)
                active = Active(int(record["cohort"]), int(record["generation"]), float(record.get("since", 0.0)))
        except (ValueError, KeyError, TypeError):
            continue
    return DeploymentView(slots=slots, active=active, agents=frozenset(agents), gms_lost=gms_lost, gone=gone)


def read_view(etcd: Etcd, keys: Keys) -> DeploymentView:
    """One range read of the deployment's prefix (raises EtcdError when etcd does not answer)."""
    return parse_view(keys, etcd.get_prefix(keys.root))
