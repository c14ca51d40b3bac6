"""shadowline.common.progress: vLLM's progress metrics parsed from a Dynamo system port's /metrics text, and the
stall judgement (requests running, token counter still), on monotonic times."""

from __future__ import annotations

import pytest

from shadowline.common import progress
from shadowline.common.policy import HangPolicy
from shadowline.common.progress import Observation, ProgressSample, judge, parse_sample

MODEL = "Qwen/Qwen3-0.6B"
LABELS = (f'dynamo_component="backend",dynamo_endpoint="generate",dynamo_namespace="dynamo",engine="0",'
          f'model="{MODEL}",model_name="{MODEL}",worker_id="694d9a3c1e5f0b21"')


def engine_labels(engine: int) -> str:
    return LABELS.replace('engine="0"', f'engine="{engine}"')


def exposition(tokens: float, running: float, *, engines: int = 1, extra: str = "") -> str:
    """What dynamo.vllm's system port serves (vLLM's registry re-exported with Dynamo's labels added)."""
    lines = ["# HELP dynamo_component_requests_total Total requests", "# TYPE dynamo_component_requests_total counter",
             'dynamo_component_requests_total{dynamo_endpoint="generate"} 12',
             "# HELP vllm:num_requests_running Number of requests in model execution batches.",
             "# TYPE vllm:num_requests_running gauge"]
    lines += [f"vllm:num_requests_running{{{engine_labels(e)}}} {running}" for e in range(engines)]
    lines += ["# HELP vllm:generation_tokens_total Number of generation tokens processed.",
              "# TYPE vllm:generation_tokens_total counter"]
    for e in range(engines):
        labels = engine_labels(e)
        lines += [f"vllm:generation_tokens_total{{{labels}}} {tokens}",
                  f"vllm:generation_tokens_created{{{labels}}} 1.7e9"]
    return "\n".join(lines) + "\n" + extra


# -- parsing ------------------------------------------------------------------------------------------------------ #

def test_parses_vllm_progress_metrics_as_dynamo_serves_them():
    assert parse_sample(exposition(1234.0, 3.0)) == ProgressSample(tokens=1234.0, running=3.0)


def test_dynamo_handler_gauge_counts_requests_that_vllms_gauge_has_not_seen():
    """A step that hangs after an idle spell: vLLM's gauge stays at 0 (it is published after each step), Dynamo's
    generate handler counts the requests that entered; other endpoints' handlers are left out."""
    handler = ('dynamo_component_inflight_requests{dynamo_component="backend",dynamo_endpoint="generate",'
               'dynamo_namespace="dynamo",worker_id="694d9a3c1e5f0b21"} 3\n'
               'dynamo_component_inflight_requests{dynamo_component="backend",dynamo_endpoint="clear_kv_blocks",'
               'dynamo_namespace="dynamo",worker_id="694d9a3c1e5f0b21"} 5\n')
    assert parse_sample(exposition(1234.0, 0.0, extra=handler)) == ProgressSample(tokens=1234.0, running=3.0)
    assert parse_sample(exposition(1234.0, 4.0, extra=handler)) == ProgressSample(tokens=1234.0, running=4.0)
    assert parse_sample(exposition(1.0, 0.0, extra=handler), model_name=MODEL) == ProgressSample(1.0, 3.0)
    assert parse_sample(handler) is None  # no vLLM metrics: not a vLLM engine (or still starting)


def test_engine_cores_are_summed():
    assert parse_sample(exposition(100.0, 2.0, engines=2)) == ProgressSample(tokens=200.0, running=4.0)


def test_other_models_are_left_out():
    assert parse_sample(exposition(10.0, 1.0), model_name=MODEL) == ProgressSample(10.0, 1.0)
    assert parse_sample(exposition(10.0, 1.0), model_name="other/model") is None


def test_text_without_vllm_metrics_has_no_sample():
    assert parse_sample("") is None
    assert parse_sample("# TYPE dynamo_component_requests_total counter\ndynamo_component_requests_total 3\n") is None
    only_gauge = "vllm:num_requests_running{engine=\"0\"} 1\n"
    assert parse_sample(only_gauge) is None


def test_fallback_parser_reads_the_same(monkeypatch):
    """Where prometheus_client is missing (Ansible's sanity import), the stdlib parser gives the same sample."""
    monkeypatch.setattr(progress, "text_string_to_metric_families", None)
    assert parse_sample(exposition(1234.0, 3.0)) == ProgressSample(tokens=1234.0, running=3.0)
    assert parse_sample(exposition(5.0, 1.0, engines=2), model_name=MODEL) == ProgressSample(10.0, 2.0)
    escaped = 'vllm:generation_tokens_total{model_name="a\\"b"} 7 1700000000000\nvllm:num_requests_running 0\n'
    assert parse_sample(escaped, model_name='a"b') == ProgressSample(7.0, 0.0)


def test_a_broken_line_does_not_hide_the_rest():
    text = exposition(42.0, 1.0, extra="this is { not a metric line\n")
    assert parse_sample(text) == ProgressSample(42.0, 1.0)


def test_nan_values_are_ignored():
    text = exposition(42.0, 1.0).replace("vllm:num_requests_running{", "vllm:num_requests_running_x{")
    text += "vllm:num_requests_running NaN\n"
    assert parse_sample(text) is None


# -- judging ------------------------------------------------------------------------------------------------------ #

STALL = 5.0


def run(samples: list[tuple[float, float, float]], stall_s: float = STALL) -> list[progress.Verdict]:
    """Judge (now, tokens, running) samples in order; the verdicts."""
    observation = None
    verdicts = []
    for now, tokens, running in samples:
        verdict = judge(observation, ProgressSample(tokens, running), now, HangPolicy(2.0, stall_s))
        observation = verdict.observation
        verdicts.append(verdict)
    return verdicts


def test_first_sample_is_never_a_stall():
    (verdict,) = run([(100.0, 50.0, 4.0)])
    assert not verdict.stalled and verdict.observation == Observation(50.0, 100.0, True)


def test_moving_counter_is_progress():
    verdicts = run([(t, 10.0 * t, 2.0) for t in range(0, 60)])
    assert not any(v.stalled for v in verdicts)


def test_running_with_a_still_counter_stalls_after_stall_s():
    verdicts = run([(0.0, 10.0, 2.0), (1.0, 20.0, 2.0), (3.0, 20.0, 2.0), (6.0, 20.0, 2.0), (6.5, 20.0, 2.0)])
    assert [v.stalled for v in verdicts] == [False, False, False, False, True]
    assert verdicts[-1].still_s == pytest.approx(5.5)  # since the counter last moved (t=1)
    assert "no token generated for 5.5 s" in progress.describe(verdicts[-1], HangPolicy(2.0, STALL))


def test_exactly_stall_s_is_not_yet_a_stall():
    assert not run([(0.0, 10.0, 1.0), (5.0, 10.0, 1.0)])[-1].stalled


def test_idle_engine_is_never_stalled():
    verdicts = run([(t, 10.0, 0.0) for t in range(0, 100, 5)])
    assert not any(v.stalled for v in verdicts)
    assert progress.describe(verdicts[-1], HangPolicy(2.0, STALL)) == "idle"


def test_requests_arriving_after_idle_get_the_whole_stall_time():
    """Idle for a minute with the counter still, then requests start: their clock starts when they do."""
    verdicts = run([(0.0, 10.0, 0.0), (60.0, 10.0, 0.0), (61.0, 10.0, 3.0), (65.0, 10.0, 3.0), (66.5, 10.0, 3.0)])
    assert [v.stalled for v in verdicts] == [False, False, False, False, True]
    assert verdicts[-1].still_s == pytest.approx(5.5)


def test_counter_reset_is_a_restart_not_a_stall():
    verdicts = run([(0.0, 500.0, 2.0), (4.0, 500.0, 2.0), (5.0, 0.0, 2.0), (9.0, 0.0, 2.0), (10.5, 0.0, 2.0)])
    assert verdicts[2].reset and not verdicts[2].stalled
    assert "restarted" in progress.describe(verdicts[2], HangPolicy(2.0, STALL))
    assert [v.stalled for v in verdicts] == [False, False, False, False, True]  # judged afresh from t=5


def test_long_prefill_within_stall_s_is_not_a_stall():
    """vLLM counts no generated token while it prefills a long prompt (running 1, counter still), then the
    first token and the decode steps move it. A prefill shorter than progress_stall_s is never a stall, which is
    why the default for real engines exceeds the longest prefill (docs/detection.md)."""
    prefill_s = 40.0
    stall_s = 60.0
    samples = [(0.0, 1000.0, 0.0)]  # idle
    samples += [(1.0 + i, 1000.0, 1.0) for i in range(int(prefill_s))]  # one long prompt prefilling
    samples += [(1.0 + prefill_s + i * 0.1, 1001.0 + i, 1.0) for i in range(50)]  # its decode
    assert not any(v.stalled for v in run(samples, stall_s))
    assert run(samples, stall_s=30.0)[-51].stalled  # the same prefill under a drill's tight setting is one


def test_slow_but_progressing_engine_is_never_stalled():
    """One token every 4 s (a slow engine) under a 5 s stall setting."""
    samples = [(t * 0.5, float(int(t * 0.5 // 4)), 1.0) for t in range(0, 200)]
    assert not any(v.stalled for v in run(samples))


def test_stall_stays_declared_while_nothing_moves_and_clears_on_progress():
    verdicts = run([(0.0, 1.0, 1.0), (6.0, 1.0, 1.0), (8.0, 1.0, 1.0), (9.0, 2.0, 1.0)])
    assert [v.stalled for v in verdicts] == [False, True, True, False]
