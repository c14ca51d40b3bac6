"""How the node agents agree, through the deployment's etcd (no consensus of our own).

Keys (record schema 3: docs/fleet-design.md). A replica's records, under ``/shadowline/<deployment>/replicas/<q>/``
(a deployment of one replica has replica 0):

- ``slots/<cohort>``: the cohort slot's record (``Slot``): its generation and state. Every state change is a
  compare-and-swap on the key's mod revision, so two agents can never both declare a generation failed or
  both relaunch it.
- ``gone/<cohort>/<generation>/<host>``: an agent's confirmation that its ranks of that generation are gone.
- ``active``: the serving cohort and generation, recorded when a promotion is verified.
- ``paused``: automatic failover paused by an operator (``{by, since, reason}``; control/pause.py): the agents
  declare nothing and the driver changes no slot until it is removed (a deployment's pause is one per replica).
- ``ranks/<cohort>/<host>``: the generation of the cohort's rank on that node and the configuration digest it
  runs (``RankRecord``), written by the node's agent when it starts or adopts the rank: the driver finds a
  generation whose ranks run two configurations (a mixed cohort) from them, counting only the records of the
  node's present agent (a record left by an agent that stopped says nothing of what runs there now: an upgrade
  restarts ranks while the agents are stopped).

A node's own records, under ``/shadowline/<deployment>/`` (whatever replica the node serves):

- ``agents/<host>``: an agent's presence, on its lease; gone when the agent is gone for a lease TTL. It names the
  agent's instance (``agent_instance``: one per agent process), which the agent's rank records carry too.
- ``gms_lost/<host>``: a node whose GMS server died (its weights are no longer resident for new imports).
- ``fenced/<host>``: a node whose GPU needs a reset or service (its agent writes it; an operator removes it).
- ``spares/<host>/claim``: a spare node taken by a replica's relocation (``{replica, epoch}``, created once), and a
  replica's ``membership`` (its nodes in rank order under an epoch): control/membership_store.py, not read by the
  agents yet (issue #40).

An agent watches its replica's prefix and reads, in one transaction, that prefix and its replica's nodes' own
records (view.read_view): the work of one failure is its replica's, whatever the fleet's size. Schema 2 kept a
replica's records directly under the deployment's prefix; common/schema2.py moves them to replica 0.

Slot states: ``running`` (the generation's ranks run), ``failed`` (declared failed: every agent kills its
ranks of that generation), ``launching`` (every agent starts its rank of the new generation, not before
``not_before``), ``dead`` (crash loop: given up, needs an operator). A launching slot names the configuration
(``config``: the digest of the cohort's units, deployment/units.cohort_config) its ranks must be started from:
a node whose unit holds another one refuses to start its rank (node_duties.start_refusal).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .etcd_client import KV, Etcd, EtcdError

RUNNING, FAILED, LAUNCHING, DEAD = "running", "failed", "launching", "dead"
STATES = (RUNNING, FAILED, LAUNCHING, DEAD)
SLOT_SCHEMA = 3  # the slot record's version; a writer that adds or changes a field raises it (2: config; 3: replica)


class RecordInvalid(ValueError):
    """A record in etcd that this agent cannot read: reported and ignored, never acted on."""

    def __init__(self, why: str, newer: bool = False) -> None:
        super().__init__(why)
        self.newer = newer  # written by a newer version of shadowline (a rolling upgrade), not broken


@dataclass
class Slot:
    cohort: int
    generation: int
    state: str
    reason: str = ""
    since: float = field(default_factory=time.time)
    attempts: int = 0  # consecutive failed launches (reset once a generation has run for a while)
    not_before: float = 0.0  # launching: start ranks no earlier than this (backoff); kept while it runs
    detected_by: str = ""
    config: str = ""  # the cohort configuration its ranks start from (units.cohort_config); "": any (schema 1)
    replica: int = 0  # the replica whose slot it is (its key's; schema 2 had one replica)

    def to_json(self) -> str:
        return json.dumps({"schema": SLOT_SCHEMA, **asdict(self)}, sort_keys=True)

    @classmethod
    def parse(cls, value: bytes | str) -> Slot:
        """The record as its schema says, or RecordInvalid naming what is wrong: not JSON, a schema newer than
        this agent's, a field it does not know, a missing field, a value of the wrong type or out of range."""
        data = versioned_record(value, SLOT_SCHEMA, SLOT_SCHEMA)
        schema = data.pop("schema")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise RecordInvalid(f"fields {unknown} are not in schema {schema}")
        missing = sorted({"cohort", "generation", "state"} - set(data))
        if missing:
            raise RecordInvalid(f"fields {missing} are missing")
        for name in ("cohort", "generation", "attempts", "replica"):
            if name in data and not (is_int(data[name]) and data[name] >= (1 if name == "generation" else 0)):
                raise RecordInvalid(f"{name} is {data[name]!r}, not a whole number in range")
        for name in ("since", "not_before"):
            if name in data and not is_finite(data[name]):
                raise RecordInvalid(f"{name} is {data[name]!r}, not a time")
        for name in ("reason", "detected_by", "config"):
            if name in data and not isinstance(data[name], str):
                raise RecordInvalid(f"{name} is {data[name]!r}, not text")
        if data["state"] not in STATES:
            raise RecordInvalid(f"state is {data['state']!r}, not one of {', '.join(STATES)}")
        return cls(**data)

    @classmethod
    def from_kv(cls, kv: KV) -> Slot:
        return cls.parse(kv.value)


def versioned_record(value: bytes | str, schema: int, default: int | None = None) -> dict[str, Any]:
    """A record's JSON object whose ``schema`` this agent reads (at most ``schema``; ``default`` when it names
    none, else it must), or RecordInvalid naming what is wrong: not JSON, not an object, no version number, a
    newer schema (``newer``: written by a newer shadowline, left alone)."""
    try:
        data = json.loads(value)
    except (ValueError, UnicodeDecodeError) as err:
        raise RecordInvalid(f"not JSON ({err})") from None
    if not isinstance(data, dict):
        raise RecordInvalid(f"not a JSON object but {type(data).__name__}")
    data.setdefault("schema", default)
    if not is_int(data["schema"]) or data["schema"] < 1:
        raise RecordInvalid(f"schema is {data['schema']!r}, not a version number")
    if data["schema"] > schema:
        raise RecordInvalid(f"schema {data['schema']} is newer than this agent's ({schema}): upgrade the agent",
                            newer=True)
    return data


def is_int(value: Any) -> bool:
    """A whole number as JSON gives it (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite(value: Any) -> bool:
    """A finite number as JSON gives it (not a bool, NaN or infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Keys:
    """The keys of one replica of a deployment (the module's docstring lists them): its records under
    ``replicas/<replica>/``, a node's own (``agents``, ``gms_lost``, ``fenced``) deployment-wide. ``root`` is the
    prefix an agent watches and reads its replica's records from; ``deployment_root`` the deployment's. ``replica``
    None: schema 2's layout, every record directly under the deployment's prefix (common/schema2.py moves it; the
    fleet benchmark's anchor). The replica is never implied: every caller names it."""

    def __init__(self, deployment: str, replica: int | None) -> None:
        self.deployment_root = f"/shadowline/{deployment}/"
        self.replica = replica
        self.root = self.deployment_root if replica is None else f"{self.deployment_root}replicas/{replica}/"

    def node_keys(self, hosts: list[str] | tuple[str, ...]) -> list[str]:
        """Each node's own records (presence, GMS lost, fenced): what a replica's view reads of its nodes."""
        return [key for host in hosts for key in (self.agent(host), self.gms_lost(host), self.fenced(host))]

    def holds(self, slot: Slot, key: str) -> bool:
        """Whether ``slot`` is the record its ``key`` may hold: its own cohort's key, of its own replica."""
        return key == self.slot(slot.cohort) and slot.replica == (self.replica or 0)

    def agent(self, host: str) -> str:
        return f"{self.deployment_root}agents/{host}"

    def agents(self) -> str:
        return f"{self.deployment_root}agents/"

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
        return f"{self.deployment_root}gms_lost/{host}" if host else f"{self.deployment_root}gms_lost/"

    def rank(self, cohort: int, host: str) -> str:
        """The cohort's rank on ``host``: its generation and the configuration it runs (RankRecord)."""
        return f"{self.root}ranks/{cohort}/{host}"

    def paused(self) -> str:
        """Automatic failover paused for maintenance (an operator writes and removes it: playbooks/pause.yml); in a
        fleet the replica's (its agents watch their replica's prefix only)."""
        return f"{self.root}paused"

    def fenced(self, host: str | None = None) -> str:
        """A node whose GPU needs a reset or service (its agent writes it; an operator removes it: unfence)."""
        return f"{self.deployment_root}fenced/{host}" if host else f"{self.deployment_root}fenced/"

    def membership(self) -> str:
        """The replica's membership record (control/membership.py): its nodes in rank order under an epoch."""
        return f"{self.root}membership"

    def spare_claim(self, host: str) -> str:
        """A spare node's claim by the replica relocating onto it (created once: control/membership_store.py)."""
        return f"{self.deployment_root}spares/{host}/claim"


class Coordination:
    """Slot transitions as etcd transactions."""

    def __init__(self, etcd: Etcd, deployment: str, replica: int) -> None:
        self.etcd = etcd
        self.keys = Keys(deployment, replica)

    def slot(self, cohort: int) -> tuple[Slot | None, int]:
        """The slot record and its mod revision (0 when absent); an unreadable record reads as none (its
        revision still given: a compare-and-swap may replace it)."""
        kv = self.etcd.get(self.keys.slot(cohort))
        if kv is None:
            return None, 0
        try:
            slot = Slot.from_kv(kv)
        except RecordInvalid:
            return None, kv.mod_revision
        return (slot, kv.mod_revision) if self.keys.holds(slot, kv.key) else (None, kv.mod_revision)

    def slots(self) -> dict[int, tuple[Slot, int]]:
        """Every readable slot record (unreadable ones are left out: the agents report them)."""
        result = {}
        for kv in self.etcd.get_prefix(self.keys.slots()):
            try:
                slot = Slot.from_kv(kv)
            except RecordInvalid:
                continue
            if self.keys.holds(slot, kv.key):
                result[slot.cohort] = (slot, kv.mod_revision)
        return result

    def record(self, slot: Slot) -> str:
        """The slot as written under this replica's key: it names the replica (whatever its writer left)."""
        return replace(slot, replica=self.keys.replica or 0).to_json()

    def create_slot(self, slot: Slot) -> bool:
        return self.etcd.txn_put_if_absent(self.keys.slot(slot.cohort), self.record(slot))

    def swap(self, slot: Slot, mod_revision: int) -> bool:
        """Write ``slot`` only if nobody changed the key since ``mod_revision``."""
        return self.etcd.txn_compare_and_swap(self.keys.slot(slot.cohort), mod_revision, self.record(slot))

    def declare_failed(self, cohort: int, generation: int, reason: str, host: str,
                       known: tuple[Slot, int] | None = None) -> Slot | None:
        """Mark generation failed, once: returns the new record when this call did it, else None. ``known``: the
        slot and its revision as the caller last saw them (its view): one compare-and-swap on them first, saving
        a read on the hot path; when they are stale the slot is read and the swap tried again."""
        for attempt in ((known,) if known is not None else ()) + (None,):
            current, revision = attempt if attempt is not None else self.slot(cohort)
            if current is None or current.generation != generation or current.state not in (RUNNING, LAUNCHING):
                if attempt is not None:
                    continue
                return None
            failed = Slot(cohort=cohort, generation=generation, state=FAILED, reason=reason,
                          attempts=current.attempts, detected_by=host)
            if self._swap_once(failed, revision):
                return failed
        return None

    def _swap_once(self, slot: Slot, revision: int) -> bool:
        """The swap, and whether this call wrote it: the answer to a swap that did land can be lost (cut short,
        then retried on another member, whose compare fails), so a failed or unanswered swap asks the record."""
        try:
            if self.swap(slot, revision):
                return True
        except EtcdError:
            if not self.landed(slot):
                raise
            return True
        return self.landed(slot)

    def landed(self, slot: Slot) -> bool:
        """Whether the slot's record is exactly ``slot`` (this caller's write, to the byte); EtcdError when etcd
        does not answer."""
        kv = self.etcd.get(self.keys.slot(slot.cohort))
        return kv is not None and kv.value == self.record(slot).encode()

    def confirm_gone(self, cohort: int, generation: int, host: str, when: float) -> None:
        self.etcd.put(self.keys.gone(cohort, generation, host), json.dumps({"time": when}))

    def gone_hosts(self, cohort: int, generation: int) -> dict[str, float]:
        prefix = self.keys.gone(cohort, generation)
        hosts = {}
        for kv in self.etcd.get_prefix(prefix):
            when = gone_time(kv.value)
            if when is not None:
                hosts[kv.key[len(prefix):]] = when
        return hosts

    def live_agents(self) -> set[str]:
        prefix = self.keys.agents()
        return {kv.key[len(prefix):] for kv in self.etcd.get_prefix(prefix)}

    def record_active(self, cohort: int, generation: int) -> None:
        self.etcd.put(self.keys.active(), json.dumps({"cohort": cohort, "generation": generation,
                                                      "since": time.time()}))

    def active(self) -> dict[str, Any] | None:
        kv = self.etcd.get(self.keys.active())
        if kv is None:
            return None
        try:
            record = json.loads(kv.value)
        except ValueError:
            return None
        return record if isinstance(record, dict) else None


def agent_instance(pid: int, started_ns: int) -> str:
    """One agent process's name among all that ran on its node (a pid is reused, a start time is not)."""
    return f"{pid}.{started_ns:x}"


@dataclass(frozen=True)
class RankRecord:
    """What a node's agent says of its rank of a cohort: the generation and the configuration digest it runs, and
    which agent said it (its instance, as its presence key names it; "": an older agent, whose word is not taken)."""
    generation: int
    config: str
    pid: int = 0
    agent: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def parse(cls, value: bytes | str) -> RankRecord:
        """The record, or RecordInvalid naming what is wrong."""
        try:
            data = json.loads(value)
        except (ValueError, UnicodeDecodeError) as err:
            raise RecordInvalid(f"not JSON ({err})") from None
        if not isinstance(data, dict) or not is_int(data.get("generation")) or data["generation"] < 1:
            raise RecordInvalid(f"no generation in {data!r}")
        if not isinstance(data.get("config"), str) or not is_int(data.get("pid", 0)):
            raise RecordInvalid(f"no configuration in {data!r}")
        if not isinstance(data.get("agent", ""), str):
            raise RecordInvalid(f"the agent is no name in {data!r}")
        return cls(data["generation"], data["config"], data.get("pid", 0), data.get("agent", ""))


def gone_time(value: bytes) -> float | None:
    """The time in a ``gone`` confirmation, None when the record is unreadable."""
    try:
        when = json.loads(value)["time"]
    except (ValueError, KeyError, TypeError):
        return None
    return float(when) if is_finite(when) else None
