"""vLLM's progress metrics as the stand-in leader serves them on its system port, beside Dynamo's: what dynamo.vllm
re-exports from vLLM (``vllm:num_requests_running``, a gauge; ``vllm:generation_tokens_total``, a counter; labels
``model_name`` and ``engine``, control/progress.py) so that the agent judges the stand-in as it judges real engines.

The tokens come from the worker that generates them (dynamo.mocker): its work handler's
``dynamo_component_inflight_requests`` (requests running) and ``dynamo_component_response_bytes_total`` (what it
streamed back) on the ``generate`` endpoint, sampled by the leader while the worker runs. The stand-in's counter
counts streamed bytes, not tokens: it moves exactly when tokens stream, which is all a judge compares. Like vLLM's,
both stop where they were when generation stops (a rank stuck in the collective freezes the worker): requests
stay running, the counter stands still.
"""

from __future__ import annotations

import threading

from ..control.failover_metrics import render_family
from ..control.progress import GENERATION_TOKENS, RUNNING, samples

WORKER_INFLIGHT = "dynamo_component_inflight_requests"
WORKER_RESPONSE_BYTES = "dynamo_component_response_bytes_total"
ENDPOINT = "generate"


class ProgressMetrics:
    def __init__(self, model_name: str, engine: str = "0") -> None:
        self.labels = {"model_name": model_name, "engine": engine}
        self.running = 0.0
        self.tokens = 0.0
        self._last_raw: float | None = None
        self._lock = threading.Lock()

    def observe_worker(self, text: str) -> bool:
        """Take the worker's /metrics text; False when it had no work handler metrics for ``generate`` yet."""
        running = streamed = None
        for name, labels, value in samples(text):
            if labels.get("dynamo_endpoint") != ENDPOINT:
                continue
            if name == WORKER_INFLIGHT:
                running = (running or 0.0) + value
            elif name == WORKER_RESPONSE_BYTES:
                streamed = (streamed or 0.0) + value
        if running is None and streamed is None:
            return False
        with self._lock:
            if running is not None:
                self.running = max(0.0, running)
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

    def render(self) -> str:
        with self._lock:
            running, tokens = self.running, self.tokens
        return (render_family(RUNNING, "gauge", "Number of requests in model execution batches.",
                              [(self.labels, running)])
                + render_family(GENERATION_TOKENS + "_total", "counter",
                                "Number of generation tokens processed (stand-in: bytes its worker streamed).",
                                [(self.labels, tokens)]))
