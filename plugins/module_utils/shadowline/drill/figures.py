"""Figures the benchmarks print (scripts/bench-failover, scripts/bench-client): one percentile rule, and aiperf's
per-request records cut into windows around a fault. Pure functions; no I/O but reading a records file."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0 to 1) of ``values`` as the nearest observed value (no interpolation: with a handful of
    trials the p99 is the largest), or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))]


def aiperf_records(text: str) -> list[dict[str, Any]]:
    """aiperf's ``profile_export.jsonl`` (one record per request: ``metadata.request_start_ns``, ``metrics.<tag>.
    value``, ``error``) as rows of: sent (Unix seconds), failed, error ('<code> <type>'), ttft_ms, latency_ms;
    in order of sending."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        metrics = record.get("metrics") or {}
        error = record.get("error") or {}
        rows.append({"sent": record["metadata"]["request_start_ns"] / 1e9, "failed": bool(error),
                     "error": f"{error.get('code') or ''} {error.get('type') or ''}".strip() if error else None,
                     "ttft_ms": _metric(metrics, "time_to_first_token"),
                     "latency_ms": _metric(metrics, "request_latency")})
    return sorted(rows, key=lambda r: r["sent"])


def _metric(metrics: dict[str, Any], tag: str) -> float | None:
    item = metrics.get(tag)
    return float(item["value"]) if isinstance(item, dict) and item.get("value") is not None else None


def windows(rows: list[dict[str, Any]], fault_s: float, window_s: float) -> dict[str, dict[str, Any]]:
    """The figures of the requests sent before ``fault_s`` (seconds after the first request), in the ``window_s``
    from it, and after: requests, failed, completed per second, time to first token p50/p99 and latency p99 of
    those that succeeded, and the failures by kind."""
    if not rows:
        return {}
    start = rows[0]["sent"]
    last = max(r["sent"] - start for r in rows) + 1e-9
    bounds = {"before": (0.0, fault_s), "during": (fault_s, fault_s + window_s), "after": (fault_s + window_s, last)}
    out = {}
    for name, (low, high) in bounds.items():
        chosen = [r for r in rows if low <= r["sent"] - start < high]
        ok = [r for r in chosen if not r["failed"]]
        ttfts = [r["ttft_ms"] for r in ok if r["ttft_ms"] is not None]
        latencies = [r["latency_ms"] for r in ok if r["latency_ms"] is not None]
        out[name] = {"requests": len(chosen), "failed": len(chosen) - len(ok), "rps": len(ok) / max(high - low, 1e-9),
                     "ttft_p50_ms": percentile(ttfts, 0.5), "ttft_p99_ms": percentile(ttfts, 0.99),
                     "latency_p99_ms": percentile(latencies, 0.99),
                     "errors": dict(Counter(r["error"] for r in chosen if r["failed"]))}
    return out
