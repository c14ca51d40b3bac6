"""Constant request load through the Dynamo frontend, bounded in count and time.

Open loop: request *i* is sent at ``start + i / rate`` whatever happened to the earlier ones (a client that
slows down when the server fails hides the outage), each on its own thread up to ``max_in_flight``; a request
that has not answered within ``timeout_s`` counts as failed. Every request is recorded with its start and end
(the machine's clock, so they compare with the agents' events), its HTTP status and an error text.

Every request goes through the official OpenAI SDK with its stock retries, every other one streaming
(``client="openai"``, drill/sdk_client.py: each request records what the application saw and what a client
without retries saw), or through the one plain frontend client (common/frontend.py) that the agent's probes and
the agent's probes use (``client="raw"``, where the SDK is not installed). Run in the background by the
``drill_load`` action: ``python -m shadowline.drill.load --url ... --out FILE`` writes one JSON line per
finished request and a last ``{"summary": ...}`` line; SIGTERM (or ``--stop-file``
appearing) ends it early, after the requests in flight have answered or timed out.

The Slurm drill (drill/slurm.py) runs the same loop in a thread, ``Load(...).start()`` ... ``stop()``, unbounded
until stopped, with the plain client by default; its requests are the same records.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import ssl
import sys
import threading
import time
from typing import Callable

from ..cluster.access import client_context
from ..common.frontend import Request, completion_body, first_attempt_ok, send
from . import sdk_client

__all__ = ["Load", "Request", "completion_body", "read_results", "run_load", "send", "summarize"]


def run_load(url: str, model: str, rate: float = 20.0, duration_s: float = 30.0, max_requests: int = 600,  # noqa: PLR0913 (over the size limits of pyproject.toml; split it when it changes next)
             timeout_s: float = 5.0, max_in_flight: int = 256, stop: threading.Event | None = None,
             on_result: Callable[[Request], None] | None = None, max_tokens: int = 4,
             context: ssl.SSLContext | None = None, client: str = "raw") -> list[Request]:
    """Send ``rate`` requests per second for at most ``duration_s`` seconds and ``max_requests`` requests (or
    until ``stop`` is set), then wait for the ones in flight. Returns every request, in order of sending.
    ``context``: the CA and client certificate of an https:// frontend (gms_frontend_tls). ``client``: ``raw``
    (one attempt per request) or ``openai`` (the SDK, stock retries, every other request streaming)."""
    if rate <= 0 or duration_s <= 0 or max_requests <= 0:
        raise ValueError("rate, duration_s and max_requests must be positive")
    stop = stop or threading.Event()
    body = completion_body(model, max_tokens, which_worker=True)
    sdk = sdk_client.SdkClient(url, timeout_s, context) if client == "openai" else None
    longest_s = sdk.longest_s if sdk else timeout_s
    results: list[Request] = []
    lock = threading.Lock()
    slots = threading.BoundedSemaphore(max_in_flight)
    threads: list[threading.Thread] = []

    def one(seq: int) -> None:
        try:
            result = (sdk.send(model, seq, stream=seq % 2 == 1, max_tokens=max_tokens) if sdk
                      else send(url, body, timeout_s, seq, context))
        finally:
            slots.release()
        with lock:
            results.append(result)
        if on_result:
            on_result(result)

    start = time.time()
    for seq in range(max_requests):
        due = start + seq / rate
        if due - start >= duration_s:
            break
        if stop.wait(max(0.0, due - time.time())):
            break
        if not slots.acquire(timeout=longest_s):  # every slot stuck: record the skipped send as a failure
            skipped = Request(seq=seq, start=time.time(), end=time.time(), status=0, ok=False,
                              error=f"not sent: {max_in_flight} requests in flight")
            with lock:
                results.append(skipped)
            if on_result:
                on_result(skipped)
            continue
        thread = threading.Thread(target=one, args=(seq,), name=f"load-{seq}", daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(longest_s + 5)
    if sdk:
        sdk.close()
    return sorted(results, key=lambda r: r.seq)


class Load:
    """``run_load`` in a thread until ``stop()``: ``rate`` requests per second, bounded by neither count nor time
    (the Slurm drill's load, and tests that drive one). ``requests``: every request, in order of sending, once
    stopped."""

    def __init__(self, url: str, model: str, rate: float = 20.0, timeout: float = 5.0,  # noqa: PLR0913 (run_load's options)
                 max_in_flight: int = 1024, context: ssl.SSLContext | None = None, client: str = "raw") -> None:
        self.requests: list[Request] = []
        self._stop = threading.Event()
        options = {"rate": rate, "duration_s": math.inf, "max_requests": sys.maxsize, "timeout_s": timeout,
                   "max_in_flight": max_in_flight, "stop": self._stop, "context": context, "client": client}
        self._thread = threading.Thread(target=self._run, args=(url, model, options), name="load", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def _run(self, url: str, model: str, options: dict) -> None:
        self.requests = run_load(url, model, **options)

    def stop(self) -> list[Request]:
        """Stop sending and wait (bounded by the request timeout) for the requests in flight."""
        self._stop.set()
        self._thread.join()
        return self.requests


def summarize(requests: list[Request]) -> dict[str, object]:
    ok = [r for r in requests if r.ok]
    latencies = sorted(r.end - r.start for r in ok)
    return {
        "sent": len(requests), "ok": len(ok), "failed": len(requests) - len(ok),
        "failed_sdk": len(requests) - len(ok),
        "failed_raw": sum(1 for r in requests if not first_attempt_ok(r.to_dict())),
        "streams": sum(1 for r in requests if r.stream), "retried": sum(1 for r in requests if r.attempts > 1),
        "first_start": min((r.start for r in requests), default=None),
        "last_end": max((r.end for r in requests), default=None),
        "median_latency_s": round(latencies[len(latencies) // 2], 4) if latencies else None,
    }


def read_results(path: str) -> tuple[list[dict[str, object]], dict[str, object] | None]:
    """The requests and the summary a background load wrote (the summary is None while it runs)."""
    requests: list[dict[str, object]] = []
    summary = None
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if "summary" in record:
                    summary = record["summary"]
                else:
                    requests.append(record)
    except FileNotFoundError:
        pass
    return sorted(requests, key=lambda r: r["seq"]), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shadowline.drill.load", description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--url", required=True, help="the frontend, e.g. http://198.18.0.10:8000")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second (default 20)")
    parser.add_argument("--duration", type=float, default=30.0, help="at most this many seconds (default 30)")
    parser.add_argument("--max-requests", type=int, default=600, help="at most this many requests (default 600)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds before a request counts as failed")
    parser.add_argument("--out", required=True, help="JSON lines: one per request, then the summary")
    parser.add_argument("--stop-file", help="stop sending once this file exists")
    parser.add_argument("--ca", help="an https:// frontend: the deployment's CA (gms_frontend_tls)")
    parser.add_argument("--cert", help="an https:// frontend: the client certificate to present")
    parser.add_argument("--key", help="an https:// frontend: the client certificate's key")
    parser.add_argument("--client", choices=["openai", "raw"], default="openai" if sdk_client.available() else "raw",
                        help="the OpenAI SDK with its stock retries, half the requests streaming (the default where "
                             "it is installed), or one plain attempt per request")
    args = parser.parse_args(argv)
    if bool(args.ca) != bool(args.cert) or bool(args.cert) != bool(args.key):
        parser.error("--ca, --cert and --key go together")
    context = client_context(args.ca, args.cert, args.key) if args.ca else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if args.stop_file:
        def watch() -> None:
            while not stop.wait(0.05):
                if os.path.exists(args.stop_file):
                    stop.set()
        threading.Thread(target=watch, daemon=True).start()
    out_lock = threading.Lock()
    with open(args.out, "a", encoding="utf-8") as out:
        def record(result: Request) -> None:
            with out_lock:
                out.write(json.dumps(result.to_dict(), sort_keys=True) + "\n")
                out.flush()
        requests = run_load(args.url, args.model, args.rate, args.duration, args.max_requests, args.timeout,
                            stop=stop, on_result=record, context=context, client=args.client)
        with out_lock:
            out.write(json.dumps({"summary": summarize(requests)}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
