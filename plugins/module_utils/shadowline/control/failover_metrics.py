"""Dynamo's per-engine failover metrics: state machine, Prometheus text, persisted counters, parsing.

Names, labels and semantics follow Dynamo 1.6.1 (``gpu_memory_service.failover_lock.failover_metrics``,
as Dynamo 1.6.1's engines export them):

- ``dynamo_component_engine_failover_state{state}`` 1-hot over init|standby|waking|active
- ``dynamo_component_engine_failover_state_entered_timestamp_seconds``
- ``dynamo_component_engine_failover_last_state_duration_seconds{state}``
- ``dynamo_component_engine_failover_transitions_total{from_state,to_state}``
- ``dynamo_component_engine_failover_switch_attempts_total`` / ``..._switch_success_total``

with ``engine_id``, ``model`` and ``dynamo_component`` on every sample. The two switch counters are
written through to ``failover_metrics_engine-<ENGINE_ID>.json`` (``{"attempts":N,"success":M}``)
beside the lock file and restored at start, as upstream does.

The renderer (``FailoverMetrics.render``, ``render_family``) serves the stand-in engines; the parser
(``parse_samples``, ``engine_failover_view``, reading through ``prometheus_text``) is for whatever scrapes engines
(the node agent).
Stdlib only.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field

from . import prometheus_text

logger = logging.getLogger(__name__)

PREFIX = "dynamo_component_engine_failover"
STATES = ("init", "standby", "waking", "active")
BASE_LABELS = ("engine_id", "model", "dynamo_component")

STATE = f"{PREFIX}_state"
STATE_ENTERED = f"{PREFIX}_state_entered_timestamp_seconds"
LAST_STATE_DURATION = f"{PREFIX}_last_state_duration_seconds"
TRANSITIONS = f"{PREFIX}_transitions_total"
SWITCH_ATTEMPTS = f"{PREFIX}_switch_attempts_total"
SWITCH_SUCCESS = f"{PREFIX}_switch_success_total"

HELP = {
    STATE: "Current failover state, 1-hot over the state label (init|standby|waking|active).",
    STATE_ENTERED: "Unix time the engine entered its current failover state.",
    LAST_STATE_DURATION: "Duration of the most recent completed occupancy of each state "
    "({state=waking} is the wake/switch time).",
    TRANSITIONS: "Failover state transitions, by from_state/to_state.",
    SWITCH_ATTEMPTS: "Failover promotions attempted (contended-lock wins).",
    SWITCH_SUCCESS: "Failover promotions that completed and began serving.",
}


def counters_path(persist_dir: str, engine_id: str | int) -> str:
    """Where an engine's switch counters persist: beside the lock file."""
    return os.path.join(persist_dir, f"failover_metrics_engine-{engine_id}.json")


def load_counters(path: str) -> tuple[int, int]:
    """(attempts, success) from a counters file; (0, 0) when missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return int(data.get("attempts", 0) or 0), int(data.get("success", 0) or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return 0, 0


def save_counters(path: str, attempts: int, success: int) -> None:
    """Atomic write-through (tmp + fsync + rename), as upstream."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"attempts": attempts, "success": success}, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


# -- Prometheus text exposition ----------------------------------------------------------------- #

def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render_family(
    name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]
) -> str:
    """One metric family in Prometheus text format 0.0.4 (HELP, TYPE, then samples)."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
        lines.append(f"{name}{{{inner}}} {format_value(value)}" if inner else f"{name} {format_value(value)}")
    return "\n".join(lines) + "\n"


class FailoverMetrics:
    """Per-engine failover state and counters, rendered for the engine's system ``/metrics``."""

    def __init__(self, engine_id: str | int, model: str, component: str, persist_dir: str) -> None:
        self.engine_id = str(engine_id)
        self.labels = {"engine_id": self.engine_id, "model": model or "", "dynamo_component": component or ""}
        self.persist_path = counters_path(persist_dir, self.engine_id)
        self._lock = threading.Lock()
        self.state: str | None = None
        self.entered: float | None = None
        self.last_duration: dict[str, float] = {}
        self.transitions: dict[tuple[str, str], int] = {}
        self.attempts, self.success = load_counters(self.persist_path)
        if self.attempts or self.success:
            logger.info(
                "[Shadow] restored failover counters engine=%s attempts=%d success=%d",
                self.engine_id, self.attempts, self.success,
            )

    def set_state(self, new_state: str) -> None:
        if new_state not in STATES:
            logger.warning("[Shadow] ignoring unknown failover state %r", new_state)
            return
        with self._lock:
            now = time.time()
            if self.state is not None and self.state != new_state:
                self.last_duration[self.state] = max(0.0, now - (self.entered or now))
                key = (self.state, new_state)
                self.transitions[key] = self.transitions.get(key, 0) + 1
            self.state, self.entered = new_state, now
        logger.info("[Shadow] failover_state engine=%s -> %s", self.engine_id, new_state)

    def record_switch_attempt(self) -> None:
        with self._lock:
            self.attempts += 1
            self._persist()

    def record_switch_success(self) -> None:
        with self._lock:
            self.success += 1
            self._persist()

    def _persist(self) -> None:
        try:
            save_counters(self.persist_path, self.attempts, self.success)
        except OSError as e:
            logger.warning("[Shadow] failed to persist failover counters: %s", e)

    def render(self) -> str:
        with self._lock:
            lv = self.labels
            out = [
                render_family(STATE, "gauge", HELP[STATE], [
                    ({**lv, "state": s}, 1.0 if s == self.state else 0.0) for s in STATES
                ]),
                render_family(STATE_ENTERED, "gauge", HELP[STATE_ENTERED],
                              [(dict(lv), self.entered)] if self.entered is not None else []),
                render_family(LAST_STATE_DURATION, "gauge", HELP[LAST_STATE_DURATION], [
                    ({**lv, "state": s}, d) for s, d in self.last_duration.items()
                ]),
                render_family(TRANSITIONS, "counter", HELP[TRANSITIONS], [
                    ({**lv, "from_state": a, "to_state": b}, float(n)) for (a, b), n in self.transitions.items()
                ]),
                render_family(SWITCH_ATTEMPTS, "counter", HELP[SWITCH_ATTEMPTS], [(dict(lv), float(self.attempts))]),
                render_family(SWITCH_SUCCESS, "counter", HELP[SWITCH_SUCCESS], [(dict(lv), float(self.success))]),
            ]
        return "".join(out)


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
