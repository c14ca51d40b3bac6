"""What the agent knows at one tick: one read of its replica's records and its replica's nodes' own (one etcd
transaction, one revision: common/coordination.py lists the keys), parsed into a typed view, and the clock.
Decisions (node_duties.py, driver_duties.py) read only these, the node's observations and the agent's memory; they
never read etcd themselves."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from ..common.coordination import Keys, RankRecord, RecordInvalid, Slot, gone_time
from ..common.etcd_client import KV, Etcd


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
class Invalid:
    """A record the agent cannot act on: reported once per revision, otherwise ignored."""
    revision: int
    why: str
    newer: bool = False  # written by a newer shadowline (a rolling upgrade): left alone


@dataclass(frozen=True)
class DeploymentView:
    revision: int = 0  # the store's revision of the read: a watch continues after it
    slots: dict[int, SlotEntry] = field(default_factory=dict)
    active: Active | None = None
    agents: frozenset[str] = frozenset()  # nodes whose agent holds its lease
    agent_instances: dict[str, str] = field(default_factory=dict)  # node -> its present agent's instance
    gms_lost: dict[str, str] = field(default_factory=dict)  # node -> its gms_lost key
    gone: dict[tuple[int, int], dict[str, float]] = field(default_factory=dict)  # (cohort, generation) -> node -> when
    invalid: dict[str, Invalid] = field(default_factory=dict)  # key -> why it was ignored
    fenced: dict[str, dict] = field(default_factory=dict)  # node -> its fence record (a GPU out of service)
    ranks: dict[int, dict[str, RankRecord]] = field(default_factory=dict)  # cohort -> node -> its rank's record
    paused: dict | None = None  # automatic failover paused: {by, since, reason} (control/pause.py); None: it runs

    def slot(self, cohort: int) -> Slot | None:
        entry = self.slots.get(cohort)
        return entry.slot if entry else None

    def gone_hosts(self, cohort: int, generation: int) -> dict[str, float]:
        return self.gone.get((cohort, generation), {})


def parse_view(keys: Keys, kvs: list[KV], cohorts: frozenset[int], revision: int = 0) -> DeploymentView:
    """The typed view of a replica's keys and its nodes' own (see coordination.py). A slot record that does not
    parse, names a cohort the plan does not have or another replica, lands in ``invalid`` (the agent reports it
    and acts on nothing in it); other unknown or broken keys are skipped."""
    slots: dict[int, SlotEntry] = {}
    active: Active | None = None
    agent_instances: dict[str, str] = {}  # its keys: the nodes whose agent holds its lease
    gms_lost: dict[str, str] = {}
    gone: dict[tuple[int, int], dict[str, float]] = {}
    invalid: dict[str, Invalid] = {}
    fenced: dict[str, dict] = {}
    ranks: dict[int, dict[str, RankRecord]] = {}
    paused = next((pause_record(kv.value) for kv in kvs if kv.key == keys.paused()), None)
    for kv in kvs:
        parts = record_path(keys, kv.key)
        try:
            if parts[0] == "slots" and len(parts) == 2:
                slot = Slot.from_kv(kv)
                if not keys.holds(slot, kv.key):
                    raise RecordInvalid(f"the record says cohort {slot.cohort} of replica {slot.replica}, its key "
                                        "another")
                if slot.cohort not in cohorts:
                    raise RecordInvalid(f"cohort {slot.cohort} is not in the plan (cohorts {sorted(cohorts)})")
                slots[slot.cohort] = SlotEntry(slot, kv.mod_revision)
            elif parts[0] == "agents" and len(parts) == 2:
                agent_instances[parts[1]] = presence_instance(kv.value)
            elif parts[0] == "gms_lost" and len(parts) == 2:
                gms_lost[parts[1]] = kv.key
            elif parts[0] == "fenced" and len(parts) == 2:
                record = json.loads(kv.value)
                fenced[parts[1]] = record if isinstance(record, dict) else {"detail": str(record)}
            elif parts[0] == "ranks" and len(parts) == 3:
                ranks.setdefault(int(parts[1]), {})[parts[2]] = RankRecord.parse(kv.value)
            elif parts[0] == "gone" and len(parts) == 4:
                when = gone_time(kv.value)
                if when is not None:
                    gone.setdefault((int(parts[1]), int(parts[2])), {})[parts[3]] = when
            elif parts == ["active"]:
                record = json.loads(kv.value)
                active = Active(int(record["cohort"]), int(record["generation"]), float(record.get("since", 0.0)))
        except RecordInvalid as err:
            invalid[kv.key] = Invalid(kv.mod_revision, str(err), err.newer)
        except (ValueError, KeyError, TypeError):
            continue
    return DeploymentView(revision=revision, slots=slots, active=active, agents=frozenset(agent_instances),
                          agent_instances=agent_instances,
                          gms_lost=gms_lost, gone=gone, invalid=invalid, fenced=fenced, ranks=ranks, paused=paused)


def record_path(keys: Keys, key: str) -> list[str]:
    """The parts of ``key`` after its prefix: a replica record's after the replica's (``slots``, ``gone``...), a
    node's own after the deployment's (``agents``, ``gms_lost``, ``fenced``); [""] for any other key."""
    node_records = ("agents/", "gms_lost/", "fenced/")
    if key.startswith(keys.root):
        return key[len(keys.root):].split("/")
    if key.startswith(keys.deployment_root) and key[len(keys.deployment_root):].startswith(node_records):
        return key[len(keys.deployment_root):].split("/")
    return [""]


def pause_record(value: bytes) -> dict:
    """The pause record; any value at all pauses (an operator's intent is never ignored for its spelling)."""
    try:
        record = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return {"reason": value.decode(errors="replace")[:200]}
    return record if isinstance(record, dict) else {"reason": str(record)[:200]}


def presence_instance(value: bytes) -> str:
    """The agent instance an ``agents/<host>`` record names ("": unreadable, or an older agent's)."""
    try:
        record = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return ""
    instance = record.get("instance") if isinstance(record, dict) else None
    return instance if isinstance(instance, str) else ""


def read_view(etcd: Etcd, keys: Keys, cohorts: frozenset[int], hosts: tuple[str, ...]) -> DeploymentView:
    """One transaction: the replica's prefix and the own records of ``hosts`` (the replica's nodes), at one
    revision (raises EtcdError when etcd does not answer). Schema 2's layout (``keys.replica`` None) is one
    prefix read, as it was."""
    if keys.replica is None:
        kvs, revision = etcd.range_prefix(keys.root)
    else:
        kvs, revision = etcd.read_at_once([keys.root], keys.node_keys(hosts))
    return parse_view(keys, kvs, cohorts, revision)
