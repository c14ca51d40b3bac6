"""Failover policies written once, shared by the node agent, the Slurm supervisor and watchdog, the drills and the
status table: the relaunch backoff of a slot that keeps failing, and the judgement of whether a rank is hung."""

from __future__ import annotations

from dataclasses import dataclass

from ..deployment.contract import Failover


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
