"""A steady stream of completions through the frontend, recording when each was sent, ended and how.

Used by the failover drill (and tests) to count client-visible failures around a failover. Each request runs
in its own thread so that a request hanging on a frozen engine does not hold back the ones after it. Requests
go through the one frontend client (common/frontend.py), the agent's and playbooks/drill.yml's too.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ..common.frontend import complete


@dataclass
class Request:
    sent: float  # wall clock (time.time())
    ended: float = 0.0
    status: int = 0  # HTTP status, 0 when no answer (connection refused, timeout)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200


class Load:
    """``rate`` requests per second to ``url`` until stopped; every request is kept in ``requests``."""

    def __init__(self, url: str, model: str, rate: float = 20.0, timeout: float = 5.0) -> None:
        self.url, self.model, self.interval, self.timeout = url, model, 1.0 / rate, timeout
        self.requests: list[Request] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sender = threading.Thread(target=self._run, name="load", daemon=True)

    def start(self) -> Load:
        self._sender.start()
        return self

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            req = Request(sent=time.time())
            self.requests.append(req)
            thread = threading.Thread(target=self._one, args=(req,), daemon=True)
            thread.start()
            self._threads.append(thread)
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _one(self, req: Request) -> None:
        status, text = complete(self.url, self.model, self.timeout)
        req.ended, req.status = time.time(), status
        if status != 200:
            req.error = text[:200]

    def stop(self) -> list[Request]:
        """Stop sending and wait (bounded by the request timeout) for the requests in flight."""
        self._stop.set()
        self._sender.join(self.timeout + 1)
        for thread in self._threads:
            thread.join(self.timeout + 1)
        return self.requests
