"""Generation progress of a serving engine, judged from its Prometheus text (``/metrics`` on the leader's Dynamo
system port, where dynamo.vllm re-exports vLLM's registry): pure functions, no I/O, monotonic times only.

vLLM (0.31.0, ``vllm/v1/metrics/loggers.py``) exports ``vllm:num_requests_running`` (a gauge: requests in the model
execution batch) and ``vllm:generation_tokens`` (a counter; the text format names it ``vllm:generation_tokens_total``),
both labelled ``model_name`` and ``engine`` (the engine-core index). Both are updated from the outputs of each engine
step, so when a step never ends (a rank stuck in a collective) the gauge keeps its last value and the counter stands
still: requests running with a counter that does not move is a stall, whatever ``/health`` says. An idle engine
(running 0) shows nothing in vLLM's metrics: when the step that hangs is the first after an idle spell, the gauge
stays 0 while requests pile up behind it.

Dynamo's own work handler counts those requests: ``dynamo_component_inflight_requests{dynamo_endpoint="generate"}``
(a gauge of Dynamo's runtime, 1.6.1, on the same system port) rises as soon as a request enters the handler, which
runs in the Dynamo runtime beside the engine core and keeps taking requests while a step hangs. The sample's
``running`` is the larger of the two, so a hang that starts idle is judged from the first request that meets it;
an engine that nobody sends a request to shows nothing, and only a canary (the caller's to send) finds it.

A long prefill also leaves the counter still while running is 1 (vLLM counts a generated token only when one is
sampled, after the whole prompt is prefilled), so ``stall_s`` must exceed the longest prefill the deployment allows
(docs/detection.md). The text is read by ``prometheus_text``, the one exposition parser of the package (standard
library only: Ansible's sanity import test and a node without ``prometheus_client`` read it the same).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import prometheus_text
from .policy import GENERATION_STALLED, HangPolicy

# prometheus_client's parser was once preferred here when importable; prometheus_text is now the only parser. The
# name stays (None) for callers that switched that preference off, as tests/unit/test_progress.py does.
text_string_to_metric_families = None  # pylint: disable=invalid-name

RUNNING = "vllm:num_requests_running"  # gauge
GENERATION_TOKENS = "vllm:generation_tokens"  # counter family; its sample is GENERATION_TOKENS + "_total"
HANDLER_INFLIGHT = "dynamo_component_inflight_requests"  # Dynamo's work handler gauge, labelled dynamo_endpoint
ENDPOINT = "generate"  # the engine's endpoint whose handler counts the requests


@dataclass(frozen=True)
class ProgressSample:
    """One scrape of an engine: generated tokens so far (summed over its series) and requests running now (vLLM's
    gauge, or Dynamo's handler gauge where that is larger)."""
    tokens: float
    running: float


@dataclass(frozen=True)
class Observation:
    """What the judge remembers of an engine between scrapes."""
    tokens: float  # the counter at the last sample
    changed_at: float  # monotonic time the counter last moved (or the judge first saw it, or requests started)
    running: bool  # whether requests were running at the last sample


@dataclass(frozen=True)
class Verdict:
    observation: Observation  # keep it for the next sample
    stalled: bool  # requests running and no token generated for more than stall_s
    still_s: float  # seconds since the counter last moved while requests ran (0 when idle or moving)
    reset: bool = False  # the counter went backwards: the engine restarted (a new process, a new registry)


def parse_sample(text: str, model_name: str | None = None) -> ProgressSample | None:
    """The progress sample of a ``/metrics`` text, or None when it has no vLLM progress metrics (not a vLLM
    engine, an engine still starting, or log stats disabled). ``model_name`` keeps only series with that
    ``model_name`` label (None: every series). Series of several engine cores (label ``engine``) are summed, and
    so are the ``generate`` handler's series. Only these families' lines are parsed: a real engine's /metrics
    runs to hundreds of kilobytes of histograms, and the agent reads it every few seconds."""
    tokens = running = None
    handler = 0.0
    wanted = "\n".join(line for line in text.splitlines()
                       if RUNNING in line or GENERATION_TOKENS in line or HANDLER_INFLIGHT in line)
    for name, labels, value in samples(wanted + "\n"):
        if model_name is not None and labels.get("model_name", model_name) != model_name:
            continue
        if not math.isfinite(value):
            continue
        if name == GENERATION_TOKENS + "_total":
            tokens = (tokens or 0.0) + value
        elif name == RUNNING:
            running = (running or 0.0) + value
        elif name == HANDLER_INFLIGHT and labels.get("dynamo_endpoint") == ENDPOINT:
            handler += max(0.0, value)
    if tokens is None or running is None:
        return None
    return ProgressSample(tokens=tokens, running=max(running, handler))


def judge(previous: Observation | None, sample: ProgressSample, now: float, hang: HangPolicy) -> Verdict:
    """The new observation and whether generation has stalled, from the previous observation (None: the first
    sample of this engine) and a sample taken at monotonic ``now``; the stall is ``hang``'s judgement.

    - The counter moved: progress; the clock restarts.
    - The counter went backwards: the engine restarted; start afresh from this sample (never a stall).
    - Nothing running: idle, never a stall (only a canary finds an idle hang); the clock restarts so that the
      requests of the next burst get the whole ``progress_stall_s``.
    - Requests running and the counter still for more than ``progress_stall_s``: stalled.
    """
    if previous is None or sample.tokens < previous.tokens:
        return Verdict(Observation(sample.tokens, now, sample.running > 0), stalled=False, still_s=0.0,
                       reset=previous is not None)
    if sample.tokens > previous.tokens or sample.running <= 0:
        return Verdict(Observation(sample.tokens, now, sample.running > 0), stalled=False, still_s=0.0)
    changed_at = previous.changed_at if previous.running else now  # requests just started: their clock starts
    still = max(0.0, now - changed_at)
    return Verdict(Observation(sample.tokens, changed_at, True), stalled=hang.judge(still, None) == GENERATION_STALLED,
                   still_s=still)


def describe(verdict: Verdict, hang: HangPolicy) -> str:
    """A sentence for the failure declaration and the drill report."""
    obs = verdict.observation
    if verdict.stalled:
        return (f"requests running and no token generated for {verdict.still_s:.1f} s "
                f"(vllm:generation_tokens_total stuck at {obs.tokens:g}; progress_stall_s {hang.progress_stall_s:g})")
    if verdict.reset:
        return f"the token counter went back to {obs.tokens:g}: the engine restarted"
    return "generating" if obs.running else "idle"


# -- parsing ---------------------------------------------------------------------------------------------------- #

def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample line of a Prometheus text exposition (prometheus_text)."""
    return prometheus_text.samples(text)
