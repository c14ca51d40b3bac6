"""The agent's own Prometheus metrics: counts of detections, teardowns, promotions and relaunches, and the
durations of each, in the text exposition format."""

from __future__ import annotations

import threading
from collections import defaultdict

PREFIX = "shadowline_agent_"
COUNTERS = {
    "detections_total": "Failures detected by this agent, by reason.",
    "teardowns_total": "Generations whose ranks this agent removed from its node.",
    "promotions_total": "Promotions verified by this agent (lock holder changed and serving).",
    "relaunches_total": "Ranks of a new generation started by this agent.",
    "slots_dead_total": "Slots given up after a crash loop.",
}
DURATIONS = {
    "teardown_seconds": "From the failure's detection to this node's ranks of the generation being gone.",
    "promotion_seconds": "From the failure's detection to the new lock holder serving.",
    "relaunch_seconds": "From the failure's detection to the new generation's ranks running on this node.",
}


class AgentMetrics:
    def __init__(self, deployment: str, node: str) -> None:
        self.labels = f'deployment="{deployment}",node="{node}"'
        self.counters: dict[tuple[str, str], float] = defaultdict(float)
        self.durations: dict[str, list[float]] = defaultdict(list)
        self.lock = threading.Lock()

    def count(self, name: str, reason: str = "") -> None:
        with self.lock:
            self.counters[(name, reason)] += 1

    def observe(self, name: str, seconds: float) -> None:
        with self.lock:
            self.durations[name].append(seconds)

    def render(self) -> str:
        lines: list[str] = []
        with self.lock:
            for name, help_text in COUNTERS.items():
                lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} counter"]
                samples = {reason: v for (n, reason), v in self.counters.items() if n == name} or {"": 0.0}
                for reason, value in sorted(samples.items()):
                    extra = f',reason="{reason}"' if reason else ""
                    lines.append(f"{PREFIX}{name}{{{self.labels}{extra}}} {value:g}")
            for name, help_text in DURATIONS.items():
                values = self.durations.get(name, [])
                lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} summary"]
                lines.append(f"{PREFIX}{name}_count{{{self.labels}}} {len(values)}")
                lines.append(f"{PREFIX}{name}_sum{{{self.labels}}} {sum(values):.6f}")
        return "\n".join(lines) + "\n"
