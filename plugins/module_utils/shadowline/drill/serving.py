"""Who served the load around a fault, and what the fault added to its latency: one computation for the drill
report (drill/report.py), pure.

- **Which replica served each request.** The load asks Dynamo's frontend to name the decode worker in every answer
  (``nvext.extra_fields: ["worker_id"]``, common/frontend.py: the record's ``worker``, the instance id in hex);
  ``workers`` maps instance ids to replicas (discovery's records read by the drill before and after the fault: a
  worker's request-plane host is its replica's leader node). A request whose answer named no worker, or a worker
  discovery never showed, counts as ``unknown``.
- **Added latency.** The baseline is the same load with no fault: the requests that ended before the fault (the
  drill's warm-up). The fault's requests are those in flight at the fault or sent after it. A request's added
  latency is its latency minus the baseline's median; ``added_p50_s`` / ``added_p99_s`` are the median and the
  99th percentile of that over the fault's requests. Only requests a client without retries was served count
  (the failed ones are the report's failure counts).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ..common.frontend import first_attempt_ok
from .figures import percentile

Record = Dict[str, Any]
UNKNOWN = "unknown"


def replica_of(request: Record, workers: Dict[str, Optional[int]]) -> str:
    """The replica that served a request, as a report key ("0", "1", ...; ``unknown``)."""
    replica = workers.get(str(request.get("worker") or ""))
    return UNKNOWN if replica is None else str(replica)


def latency(request: Record) -> float:
    return float(request["end"]) - float(request["start"])


@dataclass(frozen=True)
class Serving:
    """``served_by``: requests served per replica, before the fault and from it on; ``served``: [seq, replica]
    of every served request, in order of sending; the latency figures (seconds, None without requests)."""
    served_by: dict[str, dict[str, int]]
    served: list[list[Any]]
    latency_s: dict[str, Any]


def _rounded(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 4)


def serving(requests: List[Record], t0: float, workers: Dict[str, Optional[int]]) -> Serving:
    ordered = sorted(requests, key=lambda r: r["seq"])
    served = [r for r in ordered if first_attempt_ok(r)]
    baseline = [latency(r) for r in served if r["end"] < t0]
    during = [latency(r) for r in served if r["end"] >= t0]
    base_p50 = percentile(baseline, 0.5)
    added = [value - base_p50 for value in during] if base_p50 is not None else []
    phases = {"before_fault": Counter(replica_of(r, workers) for r in served if r["end"] < t0),
              "from_fault": Counter(replica_of(r, workers) for r in served if r["end"] >= t0)}
    return Serving(
        served_by={phase: dict(sorted(counts.items())) for phase, counts in phases.items()},
        served=[[r["seq"], replica_of(r, workers)] for r in served],
        latency_s={"baseline_n": len(baseline), "baseline_p50": _rounded(base_p50),
                   "baseline_p99": _rounded(percentile(baseline, 0.99)),
                   "fault_n": len(during), "fault_p50": _rounded(percentile(during, 0.5)),
                   "fault_p99": _rounded(percentile(during, 0.99)),
                   "added_p50": _rounded(percentile(added, 0.5)), "added_p99": _rounded(percentile(added, 0.99))})
