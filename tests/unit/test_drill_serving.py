"""Which replica served each request of a drill, and the latency the fault added (drill/serving.py), from the
load's records and discovery's workers; and what a Dynamo answer names (common/frontend.py, serving_worker)."""

from __future__ import annotations

from typing import Any

import pytest

from shadowline.common.frontend import serving_worker
from shadowline.drill.serving import serving

T0 = 1000.0
WORKERS = {"a1": 0, "b2": 1, "c3": 1}  # c3: replica 1's promoted shadow, registered after the fault


def request(seq: int, start: float, latency: float, worker: str, ok: bool = True,
            first_ok: bool | None = None) -> dict[str, Any]:
    return {"seq": seq, "start": T0 + start, "end": T0 + start + latency, "ok": ok, "first_ok": first_ok,
            "worker": worker}


@pytest.mark.parametrize(("answer", "worker"), [
    ({"nvext": {"worker_id": {"prefill_worker_id": 4660, "decode_worker_id": 4660}}}, "1234"),
    ({"nvext": {"worker_id": {"prefill_worker_id": 1, "decode_worker_id": 8345911349263695158}}},
     "73d2a22753c37d36"),  # the decode worker is the one that answered (a measured Dynamo 1.6.1 id)
    ({"choices": []}, ""),  # not asked: no nvext
    ({"nvext": {"worker_id": {"decode_worker_id": -1}}}, ""),
    ({"nvext": {"worker_id": {"decode_worker_id": True}}}, ""),
    ({"nvext": {"worker_id": "7"}}, ""),
    ([], ""),
])
def test_the_worker_an_answer_names(answer: Any, worker: str) -> None:
    assert serving_worker(answer) == worker


def test_served_by_replica_before_and_from_the_fault() -> None:
    requests = [request(0, -2.0, 0.1, "a1"), request(1, -1.5, 0.1, "b2"), request(2, -1.0, 0.1, "a1"),
                request(3, -0.5, 0.1, "b2"),
                request(4, -0.05, 0.6, "b2"),  # in flight at the fault: counts from the fault on
                request(5, 0.2, 0.3, "a1"), request(6, 0.4, 0.2, "c3"),
                request(7, 0.6, 0.2, "zz"),  # a worker discovery never showed
                request(8, 0.8, 0.2, ""),  # an answer that named none
                request(9, 1.0, 5.0, "b2", ok=False, first_ok=False)]  # failed: served by nobody
    seen = serving(requests, T0, WORKERS)
    assert seen.served_by == {"before_fault": {"0": 2, "1": 2},
                              "from_fault": {"0": 1, "1": 2, "unknown": 2}}
    assert seen.served == [[0, "0"], [1, "1"], [2, "0"], [3, "1"], [4, "1"], [5, "0"], [6, "1"], [7, "unknown"],
                           [8, "unknown"]]


def test_a_retried_request_is_served_by_nobody_for_a_client_without_retries() -> None:
    requests = [request(0, -1.0, 0.1, "a1"), request(1, 0.1, 1.6, "b2", ok=True, first_ok=False)]
    assert serving(requests, T0, WORKERS).served_by == {"before_fault": {"0": 1}, "from_fault": {}}


def test_added_latency_against_the_same_load_before_the_fault() -> None:
    baseline = [request(i, -2.0 + i * 0.1, 0.1 + i * 0.001, "a1") for i in range(11)]  # p50 0.105 s
    fault = [request(20 + i, 0.1 * i, 0.105 + 0.01 * i, "b2") for i in range(101)]  # 0.105 .. 1.105 s
    latency = serving(baseline + fault, T0, WORKERS).latency_s
    assert (latency["baseline_n"], latency["fault_n"]) == (11, 101)
    assert latency["baseline_p50"] == pytest.approx(0.105) and latency["baseline_p99"] == pytest.approx(0.11)
    assert latency["fault_p50"] == pytest.approx(0.605) and latency["fault_p99"] == pytest.approx(1.095)
    assert latency["added_p50"] == pytest.approx(0.5) and latency["added_p99"] == pytest.approx(0.99)


def test_no_baseline_no_added_latency() -> None:
    latency = serving([request(0, 0.5, 0.2, "a1")], T0, WORKERS).latency_s
    assert (latency["baseline_p50"], latency["added_p50"], latency["added_p99"]) == (None, None, None)
    assert latency["fault_p50"] == pytest.approx(0.2)
