"""The looks the agent's loop never waits on (systemd, an engine, etcd, the frontend): each runs in a thread of
its own that only sends, its answer put in a queue and the loop woken; the executor hands the answers over each
tick (Executor.take_probe_results, take_leader_probes, take_start_checks)."""

from __future__ import annotations

import queue
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..cluster.access import frontend_context
from ..common import frontend
from ..common.wakeup import wake
from ..deployment.plan import Plan
from .memory import PromotionSeen
from .observe import LeaderProbe, StartCheck


@dataclass(frozen=True)
class ProbeResult:
    """A frontend completion sent from a probe thread, handed back to the loop (threads write nothing else)."""
    kind: str  # "promotion", "serving" or "canary"
    request: frontend.Request
    cohort: int | None = None
    generation: int | None = None


T = TypeVar("T")


class Probes:
    """The threads' queues, one per kind of answer, and the loop's wake-up pipe."""

    def __init__(self, plan: Plan, wake_fd: int) -> None:
        self.plan = plan
        self.wake_fd = wake_fd
        self.completions: queue.Queue[ProbeResult] = queue.Queue()
        self.leader_probes: queue.Queue[LeaderProbe] = queue.Queue()
        self.start_checks: queue.Queue[StartCheck] = queue.Queue()
        self.promotion_looks: queue.Queue[tuple[int, int, PromotionSeen]] = queue.Queue()

    def answer_in_thread(self, name: str, answers: queue.Queue[T], read: Callable[[], T], why: bytes) -> None:
        """``read()`` in a thread of its own, its answer put in ``answers`` and the loop woken: the loop never
        waits on systemd, an engine, etcd or the frontend. ``read`` must always answer (an answer that never comes
        leaves its start, rank or promotion unjudged for good)."""
        def run() -> None:
            answers.put(read())
            wake(self.wake_fd, why)
        threading.Thread(target=run, name=name, daemon=True).start()

    def probe(self, kind: str, cohort: int | None = None, generation: int | None = None,
              timeout: float = 2.0) -> None:
        def send() -> ProbeResult:
            try:
                request = self.probe_answer(kind, timeout)
            except Exception as err:  # noqa: BLE001 (a probe that died unheard would read as silence: a hang)
                now = time.time()
                request = frontend.Request(0, now, now, 0, False, f"the probe failed: {type(err).__name__}: {err}")
            return ProbeResult(kind, request, cohort, generation)
        self.answer_in_thread(f"{kind}-probe", self.completions, send, b"p")

    def probe_answer(self, kind: str, timeout: float) -> frontend.Request:
        """One probe's completion through the frontend (in a probe thread)."""
        url, now = self.plan.infra.frontend_url, time.time()
        try:  # read at every probe: a rotated certificate counts at once
            context = frontend_context(self.plan)
        except (OSError, ssl.SSLError) as err:
            return frontend.Request(0, now, now, 0, False, f"the frontend's TLS files: {err}")
        if kind == "canary":
            # a canary's silence is a verdict on the engine only when the frontend itself answers (its /live within
            # a third of the time the driver gives the canary); else it is an error, recorded
            silent = frontend.unanswering(url, self.plan.failover.progress_stall_s / 3, context)
            if silent:
                return frontend.Request(0, now, time.time(), 0, False, silent)
        return frontend.probe(url, self.plan.model_id, timeout, context)
