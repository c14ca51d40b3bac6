"""What an agent remembers between ticks: its node's ranks and what it is doing to them (NodeMemory), and on
the leader node what the driver is verifying and relaunching (DriverMemory). Only the executor changes it."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ..common.frontend import Request
from ..common.progress import Observation


@dataclass
class LocalRank:
    cohort: int
    generation: int
    unit: str
    pid: int
    pidfd: int | None
    cgroup: str | None
    leader: bool
    started: float  # when systemd started the rank's main process (unix time)
    healthy_at: float | None = None  # the last 200 from the leader's /health (monotonic); None: none yet
    progress: Observation | None = None  # the leader's generation progress (vLLM's metrics); None: not seen yet
    progress_at: float = 0.0  # when (monotonic) the leader's /metrics was last read
    node: str = ""  # the node it runs on, and that node's rank: where a failure it shows is named
    node_rank: int = 0
    config: str = ""  # the cohort configuration digest it runs (its SHADOWLINE_COHORT_CONFIG; "": unknown)

    def culprit(self, signal: str, detail: str) -> dict[str, object]:
        """The evidence of a failure this rank showed first (Declare.evidence): signal, node, node rank, what."""
        return {"signal": signal, "culprit_node": self.node, "culprit_rank": self.node_rank, "evidence": detail}


@dataclass
class Start:
    """A unit start this agent began, until systemd shows the rank running (or failed)."""
    generation: int
    since: float  # monotonic
    # set once systemd was asked for the start job (NodeEffects.launch (control/node_effects.py) asks in a thread); None: asked already
    requested: threading.Event | None = None
    looked_at: float = float("-inf")  # monotonic: the last look at its unit answered (node_duties.judge_starts)
    refused: str = ""  # why the start was not asked for: the unit's configuration is not the generation's

    def asked(self) -> bool:
        """Whether systemd has the start job, so that the unit's state says something of this start."""
        return self.requested is None or self.requested.is_set()


@dataclass
class Teardown:
    """A rank being torn down, until its cgroup is empty: in its SIGTERM grace (a planned failover lets engines
    drain), or killed with processes still left (e.g. in an uninterruptible wait): never confirmed gone before."""
    rank: LocalRank
    since: float  # the declaration (unix time), the base of the teardown time
    kill_at: float  # monotonic
    killed: bool = False  # SIGKILL sent: waiting for the cgroup to empty
    reported: bool = False  # ranks-not-gone written


@dataclass(frozen=True)
class KnownFailure:
    """A generation this node knows has failed before etcd shows it: declared here, or told by the agent that
    declared it (a failure notice). Should etcd still show it running once this node's rank of it is gone (the
    declaration was not written: etcd was away, or the declaring agent died before its write), it is declared
    again with its own reason and evidence, not as rank-missing: the rank is missing because of it."""
    generation: int
    reason: str
    evidence: dict[str, Any]
    told_by: str | None  # the node whose agent declared it and told this one; None: declared here
    at: float  # monotonic: when this node learnt of it


@dataclass
class NodeMemory:
    instance: str = ""  # this agent process's name (coordination.agent_instance): its rank records carry it
    ranks: dict[int, LocalRank] = field(default_factory=dict)  # cohort -> this node's rank
    starting: dict[int, Start] = field(default_factory=dict)  # cohort -> a start in progress
    terminating: dict[int, Teardown] = field(default_factory=dict)  # cohort -> a rank not gone yet
    confirmed: set[tuple[int, int]] = field(default_factory=set)  # (cohort, generation) recorded gone by us
    detected_at: dict[tuple[int, int], float] = field(default_factory=dict)  # (cohort, generation) -> declared (unix)
    declare_errors: set[tuple[int, int]] = field(default_factory=set)
    known_failures: dict[int, KnownFailure] = field(default_factory=dict)  # cohort -> its latest known failure
    etcd_lost_since: float | None = None  # monotonic; None while etcd answers
    reported_invalid: set[tuple[str, int]] = field(default_factory=set)  # (key, revision) of records reported
    fence: dict[str, Any] | None = None  # this node's fence record, once a GPU fault took its GPU out of service
    fence_written: bool = False  # etcd has it: its absence from a later view is an operator's unfence
    probing: dict[int, int] = field(default_factory=dict)  # cohort -> generation whose leader probe is out
    checking: dict[int, int] = field(default_factory=dict)  # cohort -> generation whose start check is out
    # cohort -> its engine unit's cgroup, as systemd named it for a rank this agent tracked (a unit's cgroup path
    # does not change): whether anything runs there is a read of cgroup.procs, not a systemctl call
    unit_cgroups: dict[int, str] = field(default_factory=dict)
    # cohort -> (generation, configuration) of this node's rank as its record in etcd holds it (PublishRank)
    published: dict[int, tuple[int, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class PromotionSeen:
    """What a look at the promoted cohort found (only what was still to be found out): its leader's failover state,
    then its registration in discovery."""
    state: str | None = None  # the leader's failover state metric
    state_at: float = 0.0  # unix time
    leases: tuple[int, ...] = ()  # its registration in discovery
    leases_at: float = 0.0  # unix time
    error: str = ""  # the look itself failed (not a read that got no answer: that is only not seen)


@dataclass
class Promotion:
    """A cohort that took the failover lock, until the driver has verified that it serves."""
    cohort: int
    generation: int
    previous: str | None  # the holder before it
    lock_at: float  # unix time
    deadline: float  # monotonic: verified (active, registered, served) by then, or reported unverified
    wake_deadline: float  # monotonic: active by then, or failed (wake-timeout) so the next shadow takes over
    active_at: float | None = None  # its failover state metric says active (unix)
    leases: list[int] = field(default_factory=list)  # its discovery registration
    registered_at: float | None = None
    completion: Request | None = None  # the last verification request through the frontend
    probing: bool = False
    seen: PromotionSeen | None = None  # the latest look at it (LookAtPromotion), None before the first answer
    looking: bool = False  # a look is out
    look_sent: float = float("-inf")  # monotonic: when the last look went out


@dataclass
class Canary:
    """A one-token completion sent through the frontend to the idle serving cohort, until it is answered or
    judged unanswered (policy.HangPolicy.canary_unanswered)."""
    cohort: int
    generation: int
    sent_at: float  # monotonic
    tokens: float | None  # the leader's generated-token counter when it was sent (None: not known)
    answer: Request | None = None


@dataclass
class DriverMemory:
    mixed: set[tuple[int, int]] = field(default_factory=set)  # (cohort, generation) declared for mixed configurations
    launched_at: dict[tuple[int, int], float] = field(default_factory=dict)  # (cohort, generation) -> unix
    # (cohort, generation) -> the discovery leases its worker registered when it was promoted
    registered: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    revoked: set[tuple[int, int]] = field(default_factory=set)  # (cohort, generation) whose registration went
    unrevoked: dict[tuple[int, int], float] = field(default_factory=dict)  # failed, revocation deferred -> since (unix)
    revoke_failed_at: dict[tuple[int, int], float] = field(default_factory=dict)  # its revocation's last error (unix)
    promotion: Promotion | None = None  # the lock's new holder until its serving is verified
    serving: int | None = None  # the cohort last verified serving
    adopted: bool = False  # the first view was taken (the serving cohort read, missing slots created)
    bridge: Any = None  # the lock path's file, held by the driver itself (a lock.FailoverLock; lock_identity)
    lock_replaced_at: float | None = None  # when the lock file was found deleted or replaced while held (unix)
    holder: str | None = None  # the live lock holder, engine-<id>
    last_holder: str | None = None  # the holder before it, for promotion timing
    agents_seen: set[str] = field(default_factory=set)  # nodes whose agent was seen registered
    agents_lost: dict[str, float] = field(default_factory=dict)  # node -> since when its lease is gone (monotonic)
    serving_ok_at: float = 0.0  # monotonic: the last completion through the frontend that succeeded
    serving_probe: Request | None = None  # the last serving probe's answer
    next_serving_probe: float = 0.0  # monotonic
    canary: Canary | None = None  # the canary in flight to the idle serving cohort
    fences_reported: set[str] = field(default_factory=set)  # fenced nodes already said to need hardware
    next_canary: float = 0.0  # monotonic
