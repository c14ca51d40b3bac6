"""The drill load's OpenAI SDK client (drill/sdk_client.py) against a small OpenAI-compatible server on 127.0.0.1
that misbehaves on purpose: the real SDK's retries decide, and both counts come out of one request.

- a 503 then a 200: the application is served (ok) after one retry; a client without retries failed (first_ok);
- a 404: the SDK does not retry it, both fail;
- a stream cut before its finish reason: both fail (the SDK does not retry a stream that has begun);
- a stream that ends with a finish reason: served on the first attempt.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

pytest.importorskip("openai")

from shadowline.drill.sdk_client import SEQ_HEADER, SdkClient  # noqa: E402

COMPLETION = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
              "choices": [{"index": 0, "finish_reason": "length",
                           "message": {"role": "assistant", "content": "ok"}}]}


WORKER = {"worker_id": {"prefill_worker_id": 0x1234, "decode_worker_id": 0x1234}}  # Dynamo's answer to nvext


def chunk(finish: str | None, nvext: dict | None = None) -> bytes:
    body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": finish}]}
    if nvext:
        body["nvext"] = nvext
    return f"data: {json.dumps(body)}\n\n".encode()


class Script:
    """What the server answers per request sequence number: a list of behaviours, one per attempt."""

    def __init__(self) -> None:
        self.plans: dict[int, list[str]] = {}
        self.seen: dict[int, int] = {}
        self.lock = threading.Lock()

    def next(self, seq: int) -> str:
        with self.lock:
            n = self.seen.get(seq, 0)
            self.seen[seq] = n + 1
            plan = self.plans.get(seq, ["ok"])
            return plan[min(n, len(plan) - 1)]


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            what = script.next(int(self.headers[SEQ_HEADER]))
            if what in ("503", "404"):
                payload = json.dumps({"error": {"message": f"status {what}"}}).encode()
                self.send_response(int(what))
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            # Dynamo's frontend names the worker in the answer when the request asks (nvext.extra_fields)
            nvext = WORKER if (body.get("nvext") or {}).get("extra_fields") == ["worker_id"] else None
            if not body.get("stream"):
                payload = json.dumps({**COMPLETION, **({"nvext": nvext} if nvext else {})}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(chunk(None, nvext))
            if what == "cut":
                self.wfile.flush()
                self.close_connection = True
                return  # the stream ends without a finish reason (the engine died mid-way)
            self.wfile.write(chunk("length", nvext) + b"data: [DONE]\n\n")
            self.close_connection = True

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    httpd.shutdown()
    httpd.server_close()


def test_both_counts_come_out_of_the_sdks_own_retries(server):
    url, script = server
    script.plans = {1: ["503", "ok"], 2: ["404"], 3: ["cut"], 4: ["ok"], 5: ["ok"]}
    client = SdkClient(url, timeout_s=5.0)
    retried = client.send("m", 1, stream=False)
    assert (retried.ok, retried.first_ok, retried.attempts, retried.status, retried.first_status) == (
        True, False, 2, 200, 503)
    missing = client.send("m", 2, stream=False)
    assert (missing.ok, missing.first_ok, missing.attempts, missing.status) == (False, False, 1, 404)
    cut = client.send("m", 3, stream=True)
    assert (cut.ok, cut.first_ok, cut.stream) == (False, False, True) and "without a finish reason" in cut.error
    streamed = client.send("m", 4, stream=True)
    assert (streamed.ok, streamed.first_ok, streamed.attempts) == (True, True, 1)
    plain = client.send("m", 5, stream=False)
    assert (plain.ok, plain.first_ok, plain.attempts) == (True, True, 1)
    assert script.seen == {1: 2, 2: 1, 3: 1, 4: 1, 5: 1}  # the SDK retried the 503 once, nothing else
    # every request asked Dynamo to name its worker; the answers (streamed or not) name it, in discovery's hex
    assert (retried.worker, streamed.worker, plain.worker, cut.worker, missing.worker) == (
        "1234", "1234", "1234", "1234", "")
