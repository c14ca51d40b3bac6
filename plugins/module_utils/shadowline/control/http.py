"""The library's HTTP: one GET (a status and a body, or None when nothing answered in time), and the opener every
client of the deployment's own services uses (etcd, engines' system ports, the frontend).

Those are addresses of the deployment: requests go to them directly, never through an HTTP proxy named in the
environment (``http_proxy`` of a login shell or a Slurm job would otherwise carry etcd and health traffic off the
cluster). Stdlib only: the node daemons run outside Ansible, so ``ansible.module_utils.urls`` is not theirs.
"""

from __future__ import annotations

import http.client
import ssl
import typing
import urllib.error
import urllib.request
from dataclasses import dataclass, field

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def open_direct(request: urllib.request.Request | str, timeout: float) -> http.client.HTTPResponse:
    """Open a request to a deployment address, without any proxy; raises like urllib does."""
    return _DIRECT.open(request, timeout=timeout)


Opener = typing.Callable[[urllib.request.Request, float], http.client.HTTPResponse]


def direct_opener(context: ssl.SSLContext | None = None, *handlers: urllib.request.BaseHandler) -> Opener:
    """``open_direct`` with TLS settings (``context``: the CA and this client's certificate of an https://
    address) and extra handlers (etcd's authentication, control/etcd_client.py)."""
    if context is None and not handlers:
        return open_direct
    extra = [urllib.request.HTTPSHandler(context=context)] if context is not None else []
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), *extra, *handlers)
    return lambda request, timeout: opener.open(request, timeout=timeout)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def fetch(url: str, timeout: float, context: ssl.SSLContext | None = None) -> Answer | None:
    """GET ``url``: the answer (an HTTP error status is an answer too), None when nothing answers in time (or an
    https:// server refuses this client: ``context`` gives the CA and the client's certificate)."""
    try:
        with direct_opener(context)(urllib.request.Request(url), timeout) as response:
            return Answer(response.status, response.read(), dict(response.headers))
    except urllib.error.HTTPError as err:
        try:
            body = err.read()
        except (OSError, http.client.HTTPException):
            body = b""
        return Answer(err.code, body, dict(err.headers or {}))
    except (OSError, ValueError, http.client.HTTPException):  # no answer, or none that is HTTP (a TLS server's alert)
        return None


def http_get(url: str, timeout: float, context: ssl.SSLContext | None = None) -> tuple[int, str] | None:
    """(status, body text) or None when nothing answers within the timeout."""
    answer = fetch(url, timeout, context)
    return None if answer is None else (answer.status, answer.text)
