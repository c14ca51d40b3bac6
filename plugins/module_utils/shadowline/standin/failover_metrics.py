"""The stand-in engines' writer of Dynamo's per-engine failover metrics (names: common/failover_metrics.py): state
machine, Prometheus text, persisted counters.

The two switch counters are written through to ``failover_metrics_engine-<ENGINE_ID>.json``
(``{"attempts":N,"success":M}``) beside the lock file and restored at start, as upstream does. ``render_family``
also renders the stand-in's other metric families. Stdlib only.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time

from ..common.failover_metrics import (
    LAST_STATE_DURATION,
    STATE,
    STATE_ENTERED,
    STATES,
    SWITCH_ATTEMPTS,
    SWITCH_SUCCESS,
    TRANSITIONS,
)

# the logger's name is in every line the stand-in logs (standin/logs.py): it keeps the one its lines have carried
logger = logging.getLogger("shadowline.common.failover_metrics")

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
