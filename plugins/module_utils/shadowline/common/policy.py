"""Failover policies written once, shared by the node agent, the Slurm supervisor and watchdog, the drills and the
status table: the relaunch backoff of a slot that keeps failing, and the judgement of whether a rank is hung."""

from __future__ import annotations

from dataclasses import dataclass

from .settings import Failover


@dataclass(frozen=True)
class RelaunchDecision:
    """What follows the death of a slot's generation: the slot's count of quick failures in a row after it, and
    either the delay before the next launch or the slot given up (a crash loop)."""
    attempts: int
    gives_up: bool
    delay_s: float  # 0.0 when given up


@dataclass(frozen=True)
class RelaunchPolicy:
    """gms_failover's relaunch policy. A failure that came soon after the launch (within stable_after_s) is a
    quick failure; quick failures in a row grow the delay before the next launch, and more than
    max_attempts of them mark the slot dead (a crash loop: fix the cause, then fail over by hand)."""
    backoff_s: float  # the delay after the first quick failure; doubles with each one in a row
    backoff_max_s: float
    max_attempts: int
    stable_after_s: float  # a generation that ran this long was healthy: the count starts again

    @classmethod
    def of(cls, failover: Failover) -> RelaunchPolicy:
        return cls(backoff_s=float(failover.relaunch_backoff_s), backoff_max_s=float(failover.relaunch_backoff_max_s),
                   max_attempts=int(failover.max_relaunch_attempts), stable_after_s=float(failover.stable_after_s))

    def quick(self, ran_s: float | None) -> bool:
        """Did a generation that ran ``ran_s`` seconds (None: it never started) fail soon after its launch?"""
        return ran_s is None or ran_s < self.stable_after_s

    def attempts_after(self, attempts: int, ran_s: float | None) -> int:
        """The count of quick failures in a row after one more failure."""
        return attempts + 1 if self.quick(ran_s) else 0

    def delay(self, attempts: int) -> float:
        """The delay before the next launch after ``attempts`` quick failures in a row (0: none, relaunch now)."""
        if attempts <= 0:
            return 0.0
        return min(self.backoff_max_s, self.backoff_s * 2 ** (attempts - 1))

    def gives_up(self, attempts: int) -> bool:
        """More quick failures in a row than allowed: the slot is dead."""
        return attempts > self.max_attempts

    def after_death(self, attempts: int, ran_s: float | None) -> RelaunchDecision:
        """The one relaunch decision, the node agent's and the Slurm supervisor's: a slot that had counted
        ``attempts`` quick failures in a row lost a generation that ran ``ran_s`` seconds since its launch (None:
        it never started). A quick death counts one more, a run of stable_after_s starts the count again at 0,
        whether or not the generation parked or served meanwhile (a generation that parks, or is promoted, and
        then dies soon, again and again, is a crash loop too); past max_attempts the slot is given up, else it
        is relaunched after ``delay`` of the new count (at once after a stable run)."""
        after = self.attempts_after(attempts, ran_s)
        if self.gives_up(after):
            return RelaunchDecision(after, gives_up=True, delay_s=0.0)
        return RelaunchDecision(after, gives_up=False, delay_s=self.delay(after))


# After a node's GMS server came back empty: what the writer cohort (ENGINE_ID 0, which loads from disk and publishes)
# does, on both paths (control/driver_duties.republish_weights, slurm/watch.py)
REPUBLISH = "republish"  # end the writer's generation: it relaunches and publishes (a parked shadow serves meanwhile)
REPUBLISH_UNDER_WAY = "under-way"  # the writer is not running: its relaunch publishes anyway
REPUBLISH_DEGRADED = "degraded"  # the writer serves and no shadow is parked: serving continues, nothing republished


def republish_choice(writer_running: bool, writer_serving: bool, shadow_parked: bool) -> str:
    """The one republish decision after a GMS server restarted empty: end the running writer when it does not serve
    or a parked shadow can take over (one planned failover), else leave serving alone (degraded: a failover now would
    find no resident weights on that node)."""
    if not writer_running:
        return REPUBLISH_UNDER_WAY
    return REPUBLISH if not writer_serving or shadow_parked else REPUBLISH_DEGRADED


LEADER_HUNG = "leader-hung"  # no 200 from the leader's /health for health_timeout_s
GENERATION_STALLED = "generation-stalled"  # requests running, vLLM's token counter still for progress_stall_s
CANARY_UNANSWERED = "canary-unanswered"  # an idle serving cohort gave no token to a canary in progress_stall_s
GPU_XID = "gpu-xid"  # an Xid the catalog resolves by restarting the application: its GPU context failed
GPU_FAULT = "gpu-fault"  # the GPU needs a reset or the node service: the node is fenced
NODE_FENCED = "node-fenced"  # a slot held dead while a node is fenced (relaunched by itself after the unfence)
CONFIG_MISMATCH = "config-mismatch"  # a node's unit holds another configuration than the launching generation's
MIXED_CONFIGURATION = "mixed-configuration"  # a generation's ranks run two configurations (started from different files)

HEALTH_VERDICT_S = 1.0  # past a leader's health deadline: its probe's end, the declaration's write, the view back


def silence(last_sign: float | None, started: float, now: float) -> float | None:
    """Seconds since a rank last showed it is alive (``last_sign``: a 200 from its /health), or None when it has
    shown nothing since it started (``started``): still loading weights, which takes as long as it takes, so it
    is not judged (a start that never ends is the launch timeout)."""
    if last_sign is None or last_sign < started:
        return None
    return max(0.0, now - last_sign)


@dataclass(frozen=True)
class HangPolicy:
    """The one judgement of whether a serving engine is hung, from what real engines expose (docs/detection.md):
    used by the node agent (it declares the generation failed), the Slurm watchdog (it kills the step), the
    canary and the status table: none of them can call an engine hung that another leaves alone."""
    health_timeout_s: float  # a leader with no 200 from /health for this long is hung
    progress_stall_s: float  # requests running and the generated-token counter still this long is a stall

    @classmethod
    def of(cls, failover: Failover) -> HangPolicy:
        return cls(health_timeout_s=float(failover.health_timeout_s),
                   progress_stall_s=float(failover.progress_stall_s))

    def judge(self, generation_still_s: float | None, health_silent_s: float | None) -> str | None:
        """``generation-stalled``, ``leader-hung`` or None (not hung, or not judged yet). ``generation_still_s``:
        how long the leader's token counter has stood still while requests ran (common/progress.py; None:
        idle, or no progress metrics); ``health_silent_s``: what ``silence`` says of its /health (None: no 200
        since its start, or a headless rank, which has no /health)."""
        if generation_still_s is not None and generation_still_s > self.progress_stall_s:
            return GENERATION_STALLED
        if health_silent_s is not None and health_silent_s >= self.health_timeout_s:
            return LEADER_HUNG
        return None

    @property
    def progress_every_s(self) -> float:
        """How often a leader's /metrics is read: a tenth of progress_stall_s, between 0.1 s and 2 s. A stall is
        found within progress_stall_s plus one period, and a real engine's /metrics (hundreds of kilobytes of
        histograms) is not read more often than that matters (every 2 s at the default progress_stall_s)."""
        return min(2.0, max(0.1, self.progress_stall_s / 10))

    def canary_unanswered(self, waited_s: float) -> bool:
        """A canary completion sent to an idle serving cohort that has given no token for this long: an idle
        hang (the token counter cannot show it: nothing was running)."""
        return waited_s > self.progress_stall_s

    def health_verdict_pending(self, health_silent_s: float | None) -> bool:
        """A leader whose /health has given no 200 for at least half health_timeout_s (``health_silent_s``, as
        ``silence`` says it; None: not judged) and whose health verdict, leader-hung at its deadline, has not had
        time to land yet (HEALTH_VERDICT_S past it). Its hang is the health signal's to name: the leader itself
        does not answer. An unanswered canary waits for that verdict rather than racing it under a vaguer name
        (it would, with both timeouts alike, as the drills set them; by default /health's 2 s comes long before
        the 60 s stall)."""
        return (health_silent_s is not None
                and self.health_timeout_s / 2 <= health_silent_s < self.health_timeout_s + HEALTH_VERDICT_S)

    def health_deadline(self, last_healthy: float) -> float:
        """When a leader last healthy at ``last_healthy`` counts as hung if nothing healthy comes meanwhile."""
        return last_healthy + self.health_timeout_s
