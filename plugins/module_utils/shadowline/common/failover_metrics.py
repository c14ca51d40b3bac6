"""Dynamo's per-engine failover metrics: their names, and reading them from a scrape.

Names, labels and semantics follow Dynamo 1.6.1 (``gpu_memory_service.failover_lock.failover_metrics``,
as Dynamo 1.6.1's engines export them):

- ``dynamo_component_engine_failover_state{state}`` 1-hot over init|standby|waking|active
- ``dynamo_component_engine_failover_state_entered_timestamp_seconds``
- ``dynamo_component_engine_failover_last_state_duration_seconds{state}``
- ``dynamo_component_engine_failover_transitions_total{from_state,to_state}``
- ``dynamo_component_engine_failover_switch_attempts_total`` / ``..._switch_success_total``

with ``engine_id``, ``model`` and ``dynamo_component`` on every sample.

The parser (``parse_samples``, ``engine_failover_view``, reading through ``prometheus_text``) is for whatever scrapes
engines (the node agent, the status table); the writer the stand-in engines serve them with (state machine,
Prometheus text, persisted switch counters) is standin/failover_metrics.py.
Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import prometheus_text

PREFIX = "dynamo_component_engine_failover"
STATES = ("init", "standby", "waking", "active")
BASE_LABELS = ("engine_id", "model", "dynamo_component")

STATE = f"{PREFIX}_state"
STATE_ENTERED = f"{PREFIX}_state_entered_timestamp_seconds"
LAST_STATE_DURATION = f"{PREFIX}_last_state_duration_seconds"
TRANSITIONS = f"{PREFIX}_transitions_total"
SWITCH_ATTEMPTS = f"{PREFIX}_switch_attempts_total"
SWITCH_SUCCESS = f"{PREFIX}_switch_success_total"


# -- parsing (for scrapers) ---------------------------------------------------------------------- #

Sample = prometheus_text.Sample  # (name, labels, value): the package's one exposition parser reads them


def parse_samples(text: str, prefix: str = "") -> list[Sample]:
    """Samples of a Prometheus text exposition, optionally only names starting with ``prefix``."""
    return prometheus_text.samples(text, prefix)


@dataclass
class EngineFailoverView:
    """What an engine's ``/metrics`` says about its failover state."""

    engine_id: str
    model: str = ""
    component: str = ""
    state: str | None = None
    state_entered: float | None = None
    attempts: int = 0
    success: int = 0
    last_state_duration: dict[str, float] = field(default_factory=dict)
    transitions: dict[tuple[str, str], int] = field(default_factory=dict)


def engine_failover_view(text: str) -> dict[str, EngineFailoverView]:
    """Failover metrics of a scrape, by ``engine_id`` (one per engine; an engine port has one)."""
    views: dict[str, EngineFailoverView] = {}
    for s in parse_samples(text, PREFIX):
        eid = s.labels.get("engine_id", "")
        v = views.setdefault(eid, EngineFailoverView(eid))
        v.model = s.labels.get("model", v.model)
        v.component = s.labels.get("dynamo_component", v.component)
        if s.name == STATE and s.value == 1.0:
            v.state = s.labels.get("state")
        elif s.name == STATE_ENTERED:
            v.state_entered = s.value
        elif s.name == SWITCH_ATTEMPTS:
            v.attempts = int(s.value)
        elif s.name == SWITCH_SUCCESS:
            v.success = int(s.value)
        elif s.name == LAST_STATE_DURATION:
            v.last_state_duration[s.labels.get("state", "")] = s.value
        elif s.name == TRANSITIONS:
            v.transitions[(s.labels.get("from_state", ""), s.labels.get("to_state", ""))] = int(s.value)
    return views
