"""vLLM's progress metrics as the stand-in leader serves them on its system port, beside Dynamo's: what dynamo.vllm
re-exports from vLLM (``vllm:num_requests_running``, a gauge; ``vllm:generation_tokens_total``, a counter; labels
``model_name`` and ``engine``, common/progress.py) so that the agent judges the stand-in as it judges real engines.

The tokens come from the worker that generates them (dynamo.mocker): its work handler's
``dynamo_component_inflight_requests`` (requests running) and ``dynamo_component_response_bytes_total`` (what it
streamed back) on the ``generate`` endpoint, sampled by the leader while the worker runs. The stand-in's counter
counts streamed bytes, not tokens: it moves exactly when tokens stream, which is all a judge compares. Like vLLM's,
both stop where they were when generation stops (a rank stuck in the collective freezes the worker): requests
stay running, the counter stands still.

A frozen worker (SIGSTOP) cannot answer for its handler gauge, while a real engine's Dynamo runtime keeps taking
requests and counting them when its engine core hangs (common/progress.py). So while the worker is frozen the
leader serves the handler gauge itself: the last value it read, or the number of the worker's request-plane
connections holding requests it has not read (``Worker.requests_waiting``), whichever is larger. vLLM's own gauge
stays where it was, as vLLM's does.
"""

from __future__ import annotations

import threading

from ..common.progress import ENDPOINT, GENERATION_TOKENS, HANDLER_INFLIGHT, RUNNING, samples
from .failover_metrics import render_family

WORKER_RESPONSE_BYTES = "dynamo_component_response_bytes_total"


class ProgressMetrics:
    def __init__(self, model_name: str, engine: str = "0") -> None:
        self.labels = {"model_name": model_name, "engine": engine}
        self.running = 0.0
        self.tokens = 0.0
        self._last_raw: float | None = None
        self.handler_labels: dict[str, str] | None = None  # the worker's generate handler series, once read
        self._lock = threading.Lock()

    def observe_worker(self, text: str) -> bool:
        """Take the worker's /metrics text; False when it had no work handler metrics for ``generate`` yet."""
        running = streamed = None
        for name, labels, value in samples(text):
            if labels.get("dynamo_endpoint") != ENDPOINT:
                continue
            if name == HANDLER_INFLIGHT:
                running = (running or 0.0) + value
                self.handler_labels = labels
            elif name == WORKER_RESPONSE_BYTES:
                streamed = (streamed or 0.0) + value
        if running is None and streamed is None:
            return False
        with self._lock:
            if running is not None:
                self.running = max(0.0, running)  # the handler's gauge, which vLLM's running stands for here
            if streamed is not None:
                if self._last_raw is not None and streamed > self._last_raw:
                    self.tokens += streamed - self._last_raw
                elif self._last_raw is None:
                    self.tokens += streamed
                self._last_raw = streamed  # a new worker starts from 0: the counter keeps counting up
        return True

    def worker_replaced(self) -> None:
        """A new worker process: its counter starts again from 0 (ours does not go back)."""
        with self._lock:
            self._last_raw = None

    def render_handler_while_frozen(self, waiting: int) -> str:
        """Dynamo's generate handler gauge as a live runtime would show it while the engine core hangs: what the
        worker last showed or the requests waiting at its connections, whichever is more ('' before the worker
        was first read)."""
        with self._lock:
            if self.handler_labels is None:
                return ""
            value = max(self.running, float(waiting))
            return render_family(HANDLER_INFLIGHT, "gauge", "Requests currently being processed by work handler "
                                 "(stand-in: served by the leader while its worker is frozen)",
                                 [(self.handler_labels, value)])

    def render(self) -> str:
        with self._lock:
            running, tokens = self.running, self.tokens
        return (render_family(RUNNING, "gauge", "Number of requests in model execution batches.",
                              [(self.labels, running)])
                + render_family(GENERATION_TOKENS + "_total", "counter",
                                "Number of generation tokens processed (stand-in: bytes its worker streamed).",
                                [(self.labels, tokens)]))
