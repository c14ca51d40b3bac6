"""scripts/bench-fleet-scale's pure parts on recorded samples: etcd's /metrics text, the growth fit, the report."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench-fleet-scale"


def load_bench():
    loader = importlib.machinery.SourceFileLoader("bench_fleet_scale", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    sys.modules[loader.name] = module  # dataclasses look their module up
    loader.exec_module(module)
    return module


bench = load_bench()

# etcd 3.4.23's /metrics after a few calls through the JSON gateway (trimmed)
METRICS = """\
# HELP etcd_debugging_mvcc_events_total Total number of events sent by this member.
# TYPE etcd_debugging_mvcc_events_total counter
etcd_debugging_mvcc_events_total 5
etcd_network_client_grpc_sent_bytes_total 826
grpc_server_handled_total{grpc_code="OK",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 3
grpc_server_started_total{grpc_method="LeaseGrant",grpc_service="etcdserverpb.Lease",grpc_type="unary"} 1
grpc_server_started_total{grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"} 2
grpc_server_started_total{grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"} 5
grpc_server_started_total{grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 3
grpc_server_started_total{grpc_method="Txn",grpc_service="etcdserverpb.KV",grpc_type="unary"} 1
grpc_server_started_total{grpc_method="Watch",grpc_service="etcdserverpb.Watch",grpc_type="bidi_stream"} 2
go_memstats_heap_alloc_bytes 1.2345e+07
a broken line
"""


def test_etcds_metrics_are_parsed_and_its_calls_counted_by_method():
    samples = bench.parse_metrics(METRICS)
    assert ("go_memstats_heap_alloc_bytes", {}, 1.2345e7) in samples
    assert bench.requests_by_method(samples) == {"LeaseGrant": 1, "LeaseKeepAlive": 2, "Put": 5, "Range": 3, "Txn": 1,
                                                 "Watch": 2}  # started, not handled: a watch still open counts
    assert bench.counter(samples, "etcd_debugging_mvcc_events_total") == 5
    assert bench.counter(samples, "etcd_network_client_grpc_sent_bytes_total") == 826
    assert bench.counter(samples, "no_such_counter") == 0
    assert bench.parse_metrics('x{a="q\\"uote",b="2"} 7\n') == [("x", {"a": 'q\\"uote', "b": "2"}, 7.0)]


def test_growth_is_the_power_laws_exponent_through_the_smallest_and_largest_size():
    assert bench.growth([16, 64, 256, 1024], [10, 40, 160, 640]) == pytest.approx(1.0)  # linear
    assert bench.growth([16, 1024], [12, 12]) == pytest.approx(0.0)  # flat
    assert bench.growth([1024, 16], [4096 * 64, 64]) == pytest.approx(2.0)  # any order
    assert bench.growth([16, 64, 256], [None, 5, 20]) == pytest.approx(1.0)  # a size without a figure is skipped
    assert bench.growth([16, 64], [0, 5]) is None and bench.growth([16], [3]) is None
    assert bench.growth([16, 16], [3, 4]) is None


def test_the_offered_rate_follows_the_agents_periods():
    # replicas of 2: one rank 0 (a view read and a watch every 0.2 s) and one other (every 1 s), a keepalive a second
    assert bench.offered_rps(2, 2, 3) == pytest.approx((2 / 0.2 + 1) + (2 / 1.0 + 1))
    assert bench.offered_rps(16, 8, 3) == pytest.approx(2 * 11 + 14 * 3)


def test_a_replicas_cohorts_and_keys_in_each_layout():
    assert bench.cohort_ids("anchor", 3) == [6, 7] and bench.cohort_ids("fleet", 3) == [0, 1]
    assert bench.layout_keys("anchor", "d", 3).root == "/shadowline/d/"
    assert bench.layout_keys("fleet", "d", 3).root == "/shadowline/d/replicas/3/"


def result(nodes, layout, rest, requests, acts):
    return bench.Result(nodes, 2, layout, rest_rps=rest, offered_rps=rest, rest_sent_kib_s=rest / 10,
                        failure_requests=requests, failure_events=requests, failure_net=requests, act_s=acts)


def test_the_report_prints_the_table_the_ratios_and_the_growth():
    results = [result(16, "anchor", 100.0, [60.0, 70.0, 80.0], [0.1, 0.2]),
               result(16, "fleet", 100.0, [12.0], [0.02, 0.04]),
               result(64, "anchor", 400.0, [280.0], [0.5, 0.9]),
               result(64, "fleet", 400.0, [12.0], [0.03, 0.05])]
    assert results[0].figures()["req_per_failure"] == 70.0 and results[0].figures()["act_max_s"] == 0.2
    text = bench.report(results)
    lines = text.splitlines()
    assert lines[0].split() == ["N", "replica", "layout", "rest", "req/s", "rest", "KiB/s", "served/offered",
                                "req/fail", "events/fail", "etcd", "net/fail", "act", "p50", "ms", "act", "max", "ms"]
    assert lines[2].split() == ["16", "2", "anchor", "100", "10", "1.00", "70", "70", "70", "100", "200"]
    ratios = lines[lines.index("fleet / anchor (same N, same replica size):") + 3].split()
    assert ratios[:5] == ["16", "2", "1.000", "1.000", f"{12 / 70:.3f}"]
    growth = {tuple(line.split()[:2]): line.split() for line in lines[-2:]}
    assert growth[("2", "anchor")][2:5] == ["16-64", "1.00", "1.00"]  # rest linear
    assert growth[("2", "anchor")][5] == f"{math.log(280 / 70) / math.log(4):.2f}"
    assert growth[("2", "fleet")][5] == "0.00"  # requests per failure flat
    assert growth[("2", "anchor")][-1] == "-"  # served all it was offered
    results[2].rest_rps = 200.0  # half of its offered rate: saturated
    assert bench.report(results).splitlines()[-2].split()[-1] == "64"


def test_a_report_of_one_layout_or_one_size_has_no_ratios_or_growth():
    alone = result(16, "fleet", 50.0, [], [])
    alone.notes.append("failure 1: replica 0: 1 of 2 nodes acted in 120 s")
    text = bench.report([alone])
    assert "fleet / anchor" not in text and "growth" not in text
    assert "  16 nodes, replicas of 2, fleet: failure 1: replica 0: 1 of 2 nodes acted in 120 s" in text.splitlines()
    assert text.splitlines()[2].split()[-5:] == ["-", "-", "-", "-", "-"]


def test_the_options():
    args = bench.arguments(["--sizes", "16,64", "--layouts", "fleet"])
    assert args.sizes == [16, 64] and args.replica_sizes == [2, 8] and args.layouts == ["fleet"]
    assert bench.arguments([]).sizes == [16, 64, 256, 1024] and bench.arguments([]).rest_s == 10.0
    for bad in (["--sizes", "16,x"], ["--sizes", "0"], ["--layouts", "mesh"], ["--failures", "0"]):
        with pytest.raises(SystemExit):
            bench.arguments(bad)


def test_the_bench_runs_both_layouts_on_a_real_etcd(tmp_path: Path):
    """The whole bench, at its smallest (4 simulated agents, replicas of 2, one failure per layout): it once stopped
    at its first record write after Coordination came to need a replica, and only its pure parts were tested."""
    import json
    import subprocess

    report = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "4", "--replica-sizes", "2", "--rest-s", "1",
                           "--settle-s", "0.5", "--failures", "1", "--json", str(report)],
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "fleet / anchor (same N, same replica size):" in proc.stdout, proc.stdout
    rows = json.loads(report.read_text())
    assert rows, rows
