"""What the agent's decisions ask for: small records, performed by executor.py. A decision never does I/O; it
returns a list of these, and the executor runs them in order (systemctl, cgroup kills, etcd transactions,
events, metrics, and the agent's memory)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from ..common.coordination import Slot
from ..common.progress import Observation
from .memory import KnownFailure, LocalRank, Promotion


# --- records and wake-ups -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    """One line of the event log."""
    event: str
    cohort: int | None = None
    generation: int | None = None
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ReportFault:
    """An unexpected error of a look done in a thread (a leader's probe, a start's look), answered to the loop:
    one event line, the same error of the same look at most every ERROR_REPORT_S (a fault that repeats every
    look must not flood the log); the loop goes on with its tick, and the next look is taken as usual. Also the
    failure notices (failure_notices.py) refused or left unsent, which concern no cohort of this node (None)."""
    event: str
    cohort: int | None
    generation: int | None
    error: str


@dataclass(frozen=True)
class WakeAt:
    """Look again at this monotonic time (a health deadline, a delayed launch), not a period later."""
    mono: float
    full: bool = False  # reconcile the latest view then (a delayed launch, a relay), not only check health


# --- a node's ranks --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Declare:
    """Compare-and-swap the slot from running/launching to failed (once, whoever is first). ``evidence`` names
    the culprit for the event log and the drill report: the signal, the node and node rank that showed it first,
    what was seen (e.g. {"signal": "progress", "node": "node0", "node_rank": 0, "detail": "..."})."""
    cohort: int
    generation: int
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class TearDown:
    """Kill this node's rank (its unit's cgroup): SIGKILL now, or SIGTERM and SIGKILL after ``grace``."""
    rank: LocalRank
    since: float  # unix time of the declaration (the base of the teardown time)
    grace: float


@dataclass(frozen=True)
class FinishTeardown:
    """The rank's cgroup is empty: confirm it gone (in etcd, after this tick's declarations)."""
    cohort: int


@dataclass(frozen=True)
class KillRest:
    """A teardown's grace ended, or processes outlived SIGKILL: SIGKILL whatever is in the cgroup (again)."""
    cohort: int


@dataclass(frozen=True)
class Confirm:
    """Record in etcd that this node has nothing (any more) of the generation."""
    cohort: int
    generation: int
    when: float


@dataclass(frozen=True)
class Launch:
    """Start this node's rank of a launching generation, from the slot's configuration (``config``: refused when
    the unit holds another, node_duties.start_refusal; "" takes whatever the unit holds)."""
    cohort: int
    generation: int
    config: str = ""


@dataclass(frozen=True)
class NoteMixed:
    """The driver declared this generation failed for its mixed configurations (declared once)."""
    cohort: int
    generation: int


@dataclass(frozen=True)
class PublishRank:
    """Write this node's record of its rank of a cohort (coordination.RankRecord): its generation and the
    configuration it runs, which the driver compares across the nodes (driver_duties.mixed_generations)."""
    cohort: int
    generation: int
    config: str
    pid: int


@dataclass(frozen=True)
class CheckStart:
    """Look at a start's unit (is its rank running, did systemd fail it?) in a thread of its own: ``systemctl
    show`` took 9-55 ms a call on a loaded testbed host, every tick of a start; the answer comes back to the loop
    as an observe.StartCheck."""
    cohort: int
    generation: int


@dataclass(frozen=True)
class Launched:
    """systemd runs the rank this agent started: track it."""
    rank: LocalRank


@dataclass(frozen=True)
class Untrack:
    """A rank found running for a start that is gone meanwhile (abandoned, or superseded: its stop is the
    abandonment's): close the pidfd the look opened on it."""
    rank: LocalRank


@dataclass(frozen=True)
class LaunchFailed:
    cohort: int
    generation: int
    failure: str


@dataclass(frozen=True)
class AbandonStart:
    """Stop a start of a generation that failed or was superseded meanwhile."""
    cohort: int
    generation: int
    slot_generation: int
    slot_state: str


@dataclass(frozen=True)
class NoteDetected:
    """Remember when a generation's failure was declared (unless known already)."""
    cohort: int
    generation: int
    when: float


@dataclass(frozen=True)
class NoteFailure:
    """Remember a generation's failure that another node's agent declared and told this one of (the first known
    of that generation is kept: its first cause)."""
    cohort: int
    failure: KnownFailure


@dataclass(frozen=True)
class MarkHealthy:
    cohort: int
    at: float  # monotonic


@dataclass(frozen=True)
class ProbeLeader:
    """Read a leader rank's /health (at most ``timeout`` s) and, when ``progress_timeout`` is given and it answered
    200, its progress metrics (at most that long), in a thread of its own; the answer comes back to the loop as
    an observe.LeaderProbe."""
    cohort: int
    generation: int
    timeout: float
    progress_timeout: float | None  # None: the progress metrics are not due


@dataclass(frozen=True)
class NoteProgress:
    """The leader's generation progress as last read (``observation`` None: its /metrics had none)."""
    cohort: int
    observation: Observation | None
    at: float  # monotonic: when it was read


@dataclass(frozen=True)
class Fence:
    """Record in etcd that this node's GPU is out of service (``record``: gpu, xid, action, detail, since): the
    driver relaunches nothing while a node is fenced. Kept in memory and written again until etcd has it."""
    host: str
    record: dict[str, Any]


@dataclass(frozen=True)
class ClearFence:
    """The operator removed this node's fence (the GPU was reset or the node serviced): forget it."""


@dataclass(frozen=True)
class SetGeneration:
    """An adopted rank (found running when the agent started) belongs to this generation."""
    cohort: int
    generation: int


@dataclass(frozen=True)
class ReportInvalid:
    """A record in etcd the agent cannot act on: say so once per revision."""
    key: str
    revision: int
    why: str
    newer: bool


@dataclass(frozen=True)
class ReportGmsLost:
    when: float


# --- the driver -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SwapSlot:
    """Compare-and-swap a slot record (relaunch, dead, running, attempts reset), then record ``then``."""
    slot: Slot
    revision: int
    kind: str  # "relaunch", "dead", "running", "stable"
    then: tuple[Record, ...] = ()
    detected: float | None = None  # relaunch: when the failed generation was declared
    launch_at: float | None = None  # relaunch: when the new generation may start (unix)


@dataclass(frozen=True)
class RevokeRegistration:
    cohort: int
    generation: int


@dataclass(frozen=True)
class DeferRevocation:
    """Keep a failed generation's registration until its successor registered: remembered apart from its slot,
    which a relaunch moves on to the next generation, possibly before the successor registered."""
    cohort: int
    generation: int
    since: float  # unix: when the generation failed


@dataclass(frozen=True)
class ObserveTeardown:
    """The whole generation is gone on every node: the teardown duration metric."""
    seconds: float


@dataclass(frozen=True)
class NoteLaunched:
    cohort: int
    generation: int
    when: float


@dataclass(frozen=True)
class SetHolder:
    holder: str | None


@dataclass(frozen=True)
class SetServing:
    """The driver's first view: the serving cohort as etcd last recorded it (None: none recorded)."""
    cohort: int | None


@dataclass(frozen=True)
class CreateSlot:
    """Create a slot record that does not exist (a cohort seen for the first time)."""
    slot: Slot


@dataclass(frozen=True)
class BeginPromotion:
    promotion: Promotion


@dataclass(frozen=True)
class TakeBridge:
    """The driver takes the lock path's (new) file itself, in the name of the serving engine, so that no engine
    that opens the path wins it while the serving one still holds the file that was deleted (lock_identity)."""
    engine_id: int


@dataclass(frozen=True)
class ReleaseBridge:
    """The serving engine let its (old) lock go: let a shadow waiting on the path's file win it."""


@dataclass(frozen=True)
class NoteLockReplaced:
    when: float


@dataclass(frozen=True)
class ExtendPromotion:
    """Push the promotion's deadlines back (etcd was away: the outage does not count)."""
    seconds: float


@dataclass(frozen=True)
class PromotionActive:
    at: float


@dataclass(frozen=True)
class PromotionRegistered:
    leases: tuple[int, ...]
    at: float


@dataclass(frozen=True)
class LookAtPromotion:
    """Look at the promoted cohort in a thread (its leader's failover state, then its registration in discovery:
    observe.look_at_promotion); the answer comes back through the executor's queue and wakes the loop."""


@dataclass(frozen=True)
class ProbePromotion:
    """Send a completion through the frontend in a thread; its answer comes back through the probe queue."""


@dataclass(frozen=True)
class EndPromotion:
    """Forget the promotion being verified (abandoned, unverified or promoted)."""
    promoted: bool = False
    count: str = ""  # a counter of the agent's metrics to add one to


@dataclass(frozen=True)
class RecordActive:
    cohort: int
    generation: int
    promote_s: float | None


@dataclass(frozen=True)
class AgentsSeen:
    """Nodes whose agent holds its lease now (from then on, their loss is noticed)."""
    nodes: frozenset[str]


@dataclass(frozen=True)
class AgentLost:
    node: str
    at: float  # monotonic


@dataclass(frozen=True)
class AgentBack:
    node: str


@dataclass(frozen=True)
class ProbeServing:
    """A completion through the frontend while an agent is lost (in a thread; the answer comes back queued)."""
    next_at: float  # monotonic: the next one not before


@dataclass(frozen=True)
class SendCanary:
    """A one-token completion through the frontend to the idle serving cohort (in a thread; the answer comes
    back queued)."""
    cohort: int
    generation: int
    sent_at: float  # monotonic
    tokens: float | None  # the leader's token counter now
    next_at: float  # monotonic: the next canary not before


@dataclass(frozen=True)
class EndCanary:
    """The canary was answered, judged, or is moot (the serving cohort changed)."""


@dataclass(frozen=True)
class RefreshLeases:
    """etcd is back after an outage: renew every discovery lease once (Dynamo 1.6.1's engines renew theirs only
    every third of their TTL after they reconnect, so a second outage soon after ends them)."""
    outage_s: float


@dataclass(frozen=True)
class NoteFences:
    """The fenced nodes the driver has said need hardware (each said once, again after an unfence)."""
    nodes: frozenset[str]


@dataclass(frozen=True)
class ClearGmsLost:
    keys: tuple[str, ...]


Action = Union[Record, ReportFault, WakeAt, Declare, TearDown, FinishTeardown, KillRest, Confirm, Launch, Launched, LaunchFailed,
               CheckStart, Untrack, AbandonStart, NoteDetected, NoteFailure, MarkHealthy, ProbeLeader, NoteProgress, Fence, ClearFence,
               SetGeneration, ReportInvalid,
               ReportGmsLost, SwapSlot, RevokeRegistration, DeferRevocation,
               ObserveTeardown, NoteLaunched, SetHolder, SetServing, CreateSlot, BeginPromotion, ExtendPromotion, TakeBridge, ReleaseBridge,
               NoteLockReplaced, PromotionActive, PromotionRegistered,
               LookAtPromotion, ProbePromotion, EndPromotion, RecordActive, AgentsSeen, AgentLost, AgentBack, ProbeServing, SendCanary, EndCanary,
               RefreshLeases, NoteFences, ClearGmsLost, NoteMixed, PublishRank]
