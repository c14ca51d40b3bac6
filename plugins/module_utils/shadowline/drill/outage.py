"""What the load saw around a fault: one computation for the drills of both paths, the agents' deployments
(drill/report.py) and a Slurm job (drill/slurm.py), so their figures compare.

The requests are the load's records (``common.frontend.Request.to_dict``, what drill/load.py writes: ``start``,
``end``, ``ok``, and for the OpenAI SDK ``first_ok``); a request counts as served when a client without retries
was served (its first attempt). Times are the machine's clock; ``rel`` gives seconds from the fault.

- the window: the requests in flight at the fault or sent after it (``end`` at or after the fault);
- ``first_failed``: the first of them (by start) that failed; ``first_ok``: the first served request (by end)
  that started after it (with no failure: after the fault);
- ``split``: the failed ones by their start against the promotion (all "before" when nothing was promoted: a
  request sent to a frozen primary fails late, but it is a failure of the old primary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

from ..common.frontend import first_attempt_ok

Record = Dict[str, Any]


def rel(t: float | None, t0: float) -> float | None:
    """Seconds from ``t0``, to the millisecond (None stays None)."""
    return None if t is None else round(t - t0, 3)


@dataclass(frozen=True)
class Outage:
    after_fault: List[Record]  # in flight at the fault or sent after it, by start
    failed: List[Record]  # of those, the ones a client without retries saw fail
    first_failed: Record | None
    first_ok: Record | None

    def split(self, promoted_at: float | None) -> tuple[int, int]:
        """(failed before the promotion, failed after it), by each failed request's start."""
        before = sum(1 for r in self.failed if promoted_at is None or r["start"] < promoted_at)
        return before, len(self.failed) - before


def outage(requests: List[Record], t0: float) -> Outage:
    """The load's window around the fault at ``t0``."""
    ordered = sorted(requests, key=lambda r: r["start"])
    after_fault = [r for r in ordered if r["end"] >= t0]
    failed = [r for r in after_fault if not first_attempt_ok(r)]
    first_failed = failed[0] if failed else None
    after_from = first_failed["start"] if first_failed else t0
    first_ok = min((r for r in ordered if first_attempt_ok(r) and r["start"] >= after_from), key=lambda r: r["end"],
                   default=None)
    return Outage(after_fault=after_fault, failed=failed, first_failed=first_failed, first_ok=first_ok)
