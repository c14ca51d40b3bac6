"""The one client of the Dynamo frontend's completion API: what the agent (promotion and serving probes), the
Slurm supervisor and the load generators send, and how the answer is judged (HTTP 200 with ``choices``)."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from http.client import HTTPException

from .http import direct_opener, fetch

PROMPT = "shadowline failover drill"


@dataclass
class Request:
    """One completion: when it was sent and ended (wall clock, to compare with the agents' events), how."""
    seq: int
    start: float
    end: float
    status: int  # HTTP status; 0 when no HTTP answer came (refused, reset, timeout)
    ok: bool
    error: str = ""
    end_mono: float = 0.0  # time.monotonic() at the end, for deadlines (not recorded)
    # Through the OpenAI SDK (drill/sdk_client.py): ``ok`` is the outcome after its retries, ``first_ok`` its first
    # attempt's (what a client without retries saw); None for a plain request, whose only attempt is ``ok``.
    attempts: int = 1
    first_ok: bool | None = None
    first_status: int | None = None  # the first attempt's HTTP status (0: no answer)
    stream: bool = False
    # The Dynamo worker that served it (its instance id in hex, as discovery keys it), where the request asked
    # the frontend for it (``nvext.extra_fields: ["worker_id"]``, completion_body's ``which_worker``); "" when
    # not asked or not answered.
    worker: str = ""

    def to_dict(self) -> dict[str, object]:
        record = asdict(self)
        record.pop("end_mono")
        return record


def first_attempt_ok(record: dict) -> bool:
    """Whether a client without retries was served (a request's record, ``Request.to_dict``): the SDK's first
    attempt, or a plain request's only one."""
    first = record.get("first_ok")
    return bool(record["ok"] if first is None else first)


WORKER_ID = {"extra_fields": ["worker_id"]}  # Dynamo's request extension: name the serving worker in the answer


def completion_body(model: str, max_tokens: int = 4, which_worker: bool = False) -> bytes:
    """A chat completion's body; ``which_worker``: ask Dynamo's frontend to name the worker that serves it (the
    drills' load, to say which replica served each request)."""
    body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
                               "max_tokens": max_tokens, "stream": False}
    if which_worker:
        body["nvext"] = WORKER_ID
    return json.dumps(body).encode()


def serving_worker(answer: object) -> str:
    """The decode worker an answer names in ``nvext.worker_id`` (Dynamo 1.6.1's response extension, asked for
    with ``nvext.extra_fields``), as the hex instance id discovery keys it by; "" when the answer names none."""
    nvext = answer.get("nvext") if isinstance(answer, dict) else None
    named = nvext.get("worker_id") if isinstance(nvext, dict) else None
    worker = named.get("decode_worker_id") if isinstance(named, dict) else None
    if isinstance(worker, bool) or not isinstance(worker, int) or worker < 0:
        return ""
    return f"{worker:x}"


def complete(url: str, model: str, timeout: float = 5.0) -> tuple[int, str]:
    """One chat completion; (HTTP status or 0, body or error text)."""
    request, text = exchange(url, completion_body(model), timeout)
    return request.status, text


def send(url: str, body: bytes, timeout_s: float, seq: int = 0, context: ssl.SSLContext | None = None) -> Request:
    """One chat completion; ok means HTTP 200 with a JSON body that has ``choices``. ``context``: the CA and
    client certificate of an https:// frontend (cluster/access.py, frontend_context)."""
    request, _payload = exchange(url, body, timeout_s, seq, context)
    return request


def exchange(url: str, body: bytes, timeout_s: float, seq: int = 0,
             context: ssl.SSLContext | None = None) -> tuple[Request, str]:
    """One chat completion: the request's record and the body of the answer (or the error text)."""
    start = time.time()
    http = urllib.request.Request(f"{url.rstrip('/')}/v1/chat/completions", data=body, method="POST",
                                  headers={"Content-Type": "application/json"})
    payload = b""
    worker = ""
    try:
        with direct_opener(context)(http, timeout_s) as response:
            payload = response.read()
            status = response.status
        try:
            answer = json.loads(payload)
            ok = status == 200 and isinstance(answer, dict) and "choices" in answer
            worker = serving_worker(answer)
            error = "" if ok else f"unexpected body: {payload[:120]!r}"
        except ValueError:
            ok, error = False, f"not JSON: {payload[:120]!r}"
    except urllib.error.HTTPError as err:
        status, ok = err.code, False
        payload = err.read()
        error = payload[:160].decode("utf-8", "replace").strip()
    except TimeoutError:
        status, ok, error = 0, False, f"no answer within {timeout_s} s"
    except HTTPException as err:  # an answer that is not HTTP (plain HTTP to a TLS frontend)
        status, ok, error = 0, False, f"not an HTTP answer: {type(err).__name__}: {str(err)[:120]}"
    except (OSError, ValueError) as err:
        status, ok = 0, False
        reason = getattr(err, "reason", err)
        error = "timeout" if "timed out" in str(reason) else str(reason)[:160]
    record = Request(seq=seq, start=start, end=time.time(), status=status, ok=ok, error=error,
                     end_mono=time.monotonic(), worker=worker)
    return record, payload.decode("utf-8", "replace") if payload else error


def unanswering(url: str, timeout_s: float, context: ssl.SSLContext | None = None) -> str | None:
    """Why the frontend itself gives no HTTP answer (to ``/live``, any status) within ``timeout_s``; None when it
    answers. A completion that goes unanswered says something of the engine only when the frontend answers: one
    restarting, hung, or speaking another protocol than the client (plain HTTP against gms_frontend_tls while the
    agents still follow the old plan) would otherwise be blamed on the serving engine."""
    if fetch(f"{url.rstrip('/')}/live", timeout_s, context) is not None:
        return None
    return f"the frontend gave no HTTP answer to /live within {timeout_s:g} s"


def probe(url: str, model: str, timeout_s: float = 2.0, context: ssl.SSLContext | None = None) -> Request:
    """One short completion (one token): is the deployment serving through the frontend?"""
    return send(url, completion_body(model, 1), timeout_s, 0, context)
