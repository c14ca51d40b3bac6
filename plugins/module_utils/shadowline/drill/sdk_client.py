"""Drill requests through the official OpenAI Python SDK, with its stock retry policy, counted two ways.

An application that talks to the frontend uses a client like this one: the SDK retries a request that got no
answer, a 408, 409, 429 or any 5xx, twice, after about 0.5 s and 1 s; a 404 (the model gone from the frontend's
list) is not retried. Each request here records every HTTP attempt the SDK made (httpx2's event hooks, matched
by a request header), so one run gives both figures of a drill:

- ``ok``: what the application saw, after the SDK's retries (``failed_sdk``);
- ``first_ok``: what a client without retries saw at that moment, the SDK's first attempt (``failed_raw``).

Every other request streams (``stream=True``): it counts as served only when the stream ends with a finish
reason, so a stream cut by a failover (not retried by the SDK) is a failure in both counts. Runs on the
controller, in the dev virtualenv where the SDK is installed (requirements/dev.lock); elsewhere the drill load
falls back to its plain client (drill/load.py).
"""

from __future__ import annotations

import ssl
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from ..common.frontend import PROMPT, WORKER_ID, Request, serving_worker

SEQ_HEADER = "x-shadowline-seq"
API_KEY = "shadowline-drill"  # the frontend asks for none; the SDK wants one


def available() -> bool:
    try:
        import openai  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


class Attempts:
    """Every HTTP attempt of every request, as status codes (0: no answer yet, or none ever)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_seq: Dict[int, List[int]] = {}

    @staticmethod
    def _seq(headers: Any) -> Optional[int]:
        value = headers.get(SEQ_HEADER)
        return int(value) if value is not None and str(value).isdigit() else None

    def on_request(self, request: Any) -> None:
        seq = self._seq(request.headers)
        if seq is not None:
            with self._lock:
                self._by_seq.setdefault(seq, []).append(0)

    def on_response(self, response: Any) -> None:
        seq = self._seq(response.request.headers)
        if seq is not None:
            with self._lock:
                attempts = self._by_seq.setdefault(seq, [0])
                attempts[-1] = response.status_code

    def of(self, seq: int) -> List[int]:
        with self._lock:
            return list(self._by_seq.pop(seq, []))


class SdkClient:
    """One OpenAI SDK client (thread-safe) for a whole load run, with its stock retries."""

    def __init__(self, url: str, timeout_s: float, context: Optional[ssl.SSLContext] = None) -> None:
        import httpx2  # noqa: PLC0415 (the SDK's HTTP library: installed with it)
        import openai  # noqa: PLC0415

        self.openai = openai
        self.timeout_s = timeout_s
        self.attempts = Attempts()
        http = httpx2.Client(verify=context if context is not None else True, timeout=timeout_s,
                             event_hooks={"request": [self.attempts.on_request],
                                          "response": [self.attempts.on_response]})
        # max_retries is left at the SDK's default: what an application gets without asking for anything
        self.client = openai.OpenAI(base_url=f"{url.rstrip('/')}/v1", api_key=API_KEY, http_client=http,
                                    timeout=timeout_s)

    def close(self) -> None:
        """Close the pooled connections (a finished load must leave no socket open to the frontend)."""
        self.client.close()

    @property
    def longest_s(self) -> float:
        """How long one request may take with every retry: each attempt's timeout, and the back-off between."""
        retries = int(self.client.max_retries)
        return (retries + 1) * self.timeout_s + retries * 8.0

    def send(self, model: str, seq: int, stream: bool, max_tokens: int = 4) -> Request:
        start = time.time()
        ok, status, error, worker = False, 0, "", ""
        messages = [{"role": "user", "content": PROMPT}]
        try:
            ok, error, worker = self._complete(model, messages, seq, stream, max_tokens)
        except self.openai.APIStatusError as err:
            status, error = err.status_code, str(err.message)[:160]
        except self.openai.APITimeoutError:
            error = f"no answer within {self.timeout_s} s"
        except self.openai.APIConnectionError as err:
            error = f"no connection: {err.__cause__ or err}"[:160]
        except Exception as err:  # noqa: BLE001 (a stream cut mid-way raises the HTTP library's own errors)
            error = f"{type(err).__name__}: {err}"[:160]
        attempts = self.attempts.of(seq)
        if attempts and not status:
            status = attempts[-1]
        return Request(seq=seq, start=start, end=time.time(), status=status, ok=ok, error=error,
                       end_mono=time.monotonic(), attempts=max(1, len(attempts)),
                       first_ok=ok and len(attempts) <= 1, first_status=attempts[0] if attempts else status,
                       stream=stream, worker=worker)

    def _complete(self, model: str, messages: List[Dict[str, str]], seq: int, stream: bool,
                  max_tokens: int) -> Tuple[bool, str, str]:
        """(served, why not, the serving worker): Dynamo's ``nvext`` asks the frontend to name the worker in the
        answer (a non-streaming answer's ``nvext``, a stream's chunks'); the SDK keeps unknown fields."""
        headers = {SEQ_HEADER: str(seq)}
        create = self.client.chat.completions.create
        extra = {"nvext": WORKER_ID}
        if not stream:
            completion = create(model=model, messages=messages, max_tokens=max_tokens, extra_headers=headers,
                                extra_body=extra)
            worker = serving_worker(completion.model_extra or {})
            return (True, "", worker) if completion.choices else (False, "an answer without choices", worker)
        chunks, finished, worker = 0, None, ""
        for chunk in create(model=model, messages=messages, max_tokens=max_tokens, stream=True,
                            extra_headers=headers, extra_body=extra):
            chunks += 1
            worker = serving_worker(chunk.model_extra or {}) or worker  # the last named: a migrated stream's
            if chunk.choices and chunk.choices[0].finish_reason:
                finished = chunk.choices[0].finish_reason
        if finished is None:
            return False, f"the stream ended after {chunks} chunks without a finish reason", worker
        return True, "", worker
