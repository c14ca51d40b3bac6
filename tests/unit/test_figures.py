"""shadowline.drill.figures: the benchmarks' percentile and aiperf's records cut into windows around a fault."""

from __future__ import annotations

import json

from shadowline.drill.figures import aiperf_records, percentile, windows

T0 = 1_795_687_600.0


def record(sent_s: float, ttft_ms: float | None = 30.0, latency_ms: float = 250.0, error: dict | None = None) -> str:
    """One line of aiperf 0.13's profile_export.jsonl (the fields the figures read, as aiperf writes them)."""
    metrics = {} if error else {"time_to_first_token": {"value": ttft_ms, "unit": "ms"},
                                "request_latency": {"value": latency_ms, "unit": "ms"},
                                "output_sequence_length": {"value": 12, "unit": "tokens"}}
    start = int((T0 + sent_s) * 1e9)
    return json.dumps({"metadata": {"request_start_ns": start, "request_end_ns": start + int(latency_ms * 1e6),
                                    "benchmark_phase": "profiling"},
                       "metrics": metrics, "error": error})


def test_percentile_is_an_observed_value():
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(v) for v in range(1, 101)], 0.99) == 99.0
    assert percentile([0.2, 0.1], 0.99) == 0.2  # with few trials the p99 is the largest


def test_records_are_read_in_order_of_sending_with_their_errors():
    lines = [record(1.0), record(0.5, ttft_ms=20.0),
             record(2.0, error={"code": 503, "type": "Service Unavailable", "message": "no instances"}), ""]
    rows = aiperf_records("\n".join(lines))
    assert [round(r["sent"] - T0, 3) for r in rows] == [0.5, 1.0, 2.0]
    assert rows[0]["ttft_ms"] == 20.0 and rows[0]["latency_ms"] == 250.0 and not rows[0]["failed"]
    assert rows[2]["failed"] and rows[2]["error"] == "503 Service Unavailable" and rows[2]["ttft_ms"] is None


def test_windows_split_by_send_time_around_the_fault():
    lines = [record(0.1 * i, ttft_ms=30.0 + i) for i in range(100)]  # 10 requests a second for 10 s
    lines[41] = record(4.1, error={"code": 503, "type": "Service Unavailable"})
    lines[42] = record(4.2, error={"code": 503, "type": "Service Unavailable"})
    figures = windows(aiperf_records("\n".join(lines)), fault_s=4.0, window_s=2.0)
    assert [figures[w]["requests"] for w in ("before", "during", "after")] == [40, 20, 40]
    assert [figures[w]["failed"] for w in ("before", "during", "after")] == [0, 2, 0]
    assert figures["during"]["errors"] == {"503 Service Unavailable": 2}
    assert figures["during"]["rps"] == 9.0  # 18 served in 2 s
    assert figures["before"]["ttft_p50_ms"] == 50.0 and figures["before"]["ttft_p99_ms"] == 69.0
    assert windows([], 1.0, 1.0) == {}
