"""The one Prometheus text parser (common/prometheus_text.py) that progress.py and failover_metrics.py read through."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shadowline.common import failover_metrics, progress
from shadowline.common.prometheus_text import Sample, parse_line, samples

HISTOGRAM = """\
# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 5.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 3.25
"""


def test_a_histogram_gives_each_bucket_sum_and_count_as_samples():
    got = samples(HISTOGRAM)
    assert [s.name for s in got] == ["vllm:e2e_request_latency_seconds_bucket"] * 2 + [
        "vllm:e2e_request_latency_seconds_count", "vllm:e2e_request_latency_seconds_sum"]
    assert got[0] == Sample("vllm:e2e_request_latency_seconds_bucket", {"engine": "0", "le": "0.3", "model_name": "m"},
                            2.0)
    assert got[1].labels["le"] == "+Inf" and got[1].value == 5.0
    assert samples(HISTOGRAM, "vllm:e2e_request_latency_seconds_s") == [got[3]]


def test_escaped_quotes_backslashes_newlines_and_braces_in_label_values():
    line = r'm{path="C:\\dir",msg="say \"hi\"\nbye",odd="a}b{c,d=e"} 1'
    assert parse_line(line) == Sample("m", {"path": "C:\\dir", "msg": 'say "hi"\nbye', "odd": "a}b{c,d=e"}, 1.0)
    assert parse_line(r'm{a="\x"} 1').labels == {"a": "\\x"}  # an unknown escape is kept as written


def test_special_values_timestamps_and_spacing():
    assert math.isnan(parse_line("m NaN").value)
    assert parse_line("m +Inf").value == math.inf
    assert parse_line("m -Inf").value == -math.inf
    assert parse_line("m 1.5e3 1700000000000").value == 1500.0
    assert parse_line('m{} 2') == Sample("m", {}, 2.0)
    assert parse_line('m{ a = "1" , b="2", } 3') == Sample("m", {"a": "1", "b": "2"}, 3.0)
    assert parse_line("   m 4   ") == Sample("m", {}, 4.0)


@pytest.mark.parametrize("line", [
    "", "   ", "# HELP m help text", "# TYPE m counter", "#m 1", "# a comment with { braces } 3",
    "m", "m{a=\"1\"}", "m one", "m 1 2 3", "m 1 not-a-time", "m{a=\"1\" 1", "m{a=1} 1", "m{a=\"1\"b=\"2\"} 1",
    "m{a=\"unterminated} 1", "1m 1", "m-x 1", "this is { not a metric line",
])
def test_what_is_not_a_sample_is_left_out(line: str):
    assert parse_line(line) is None


def test_a_broken_line_does_not_hide_the_rest():
    text = "a 1\nthis is { not a metric line\nb{x=\"y\"} 2\n"
    assert samples(text) == [Sample("a", {}, 1.0), Sample("b", {"x": "y"}, 2.0)]


def test_samples_unpack_as_tuples_and_agree_with_prometheus_client():
    text = HISTOGRAM + ('# TYPE vllm:generation_tokens counter\n'
                        'vllm:generation_tokens_total{engine="0",model_name="a\\"b"} 7 1700000000000\n'
                        'dynamo_component_inflight_requests{dynamo_endpoint="generate"} 3\n')
    ours = [(name, labels, value) for name, labels, value in samples(text)]
    theirs = [(s.name, dict(s.labels), float(s.value))
              for family in text_string_to_metric_families(text) for s in family.samples]
    assert sorted(ours, key=repr) == sorted(theirs, key=repr)


def test_progress_and_failover_metrics_read_through_it():
    text = 'dynamo_component_engine_failover_state{engine_id="0",state="active"} 1\nvllm:num_requests_running 2\n'
    assert progress.samples(text) == samples(text)
    assert failover_metrics.parse_samples(text, failover_metrics.PREFIX) == samples(text)[:1]
    assert failover_metrics.Sample is Sample
