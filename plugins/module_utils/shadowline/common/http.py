"""The library's HTTP: one GET (a status and a body, or None when nothing answered in time), the opener every
client of the deployment's own services uses (engines' system ports, the frontend), and the kept-alive connections
of a client that calls one service many times a second (etcd, common/etcd_client.py).

Those are addresses of the deployment: requests go to them directly, never through an HTTP proxy named in the
environment (``http_proxy`` of a login shell or a Slurm job would otherwise carry etcd and health traffic off the
cluster). Stdlib only: the node daemons run outside Ansible, so ``ansible.module_utils.urls`` is not theirs.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import typing
import urllib.error
import urllib.request
from dataclasses import dataclass, field

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def open_direct(request: urllib.request.Request | str, timeout: float) -> http.client.HTTPResponse:
    """Open a request to a deployment address, without any proxy; raises like urllib does."""
    return _DIRECT.open(request, timeout=timeout)


Opener = typing.Callable[[urllib.request.Request, float], http.client.HTTPResponse]


def direct_opener(context: ssl.SSLContext | None = None) -> Opener:
    """``open_direct`` with TLS settings (``context``: the CA and this client's certificate of an https://
    address)."""
    if context is None:
        return open_direct
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    return lambda request, timeout: opener.open(request, timeout=timeout)


# A kept-alive connection the server closed while it lay idle fails at once in one of these ways: the request is
# sent again on another connection (a server that died mid-request fails the same way; the requests sent here are
# ones their clients send again elsewhere anyway, as etcd's endpoint failover does). A timeout is never resent.
# (ssl.SSLEOFError: a TLS server that closed it without a close_notify, as Python's http.server does)
_CLOSED_WHILE_IDLE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, http.client.RemoteDisconnected,
                      ssl.SSLEOFError)


class KeptConnections:
    """Kept-alive connections to a few ``http://`` or ``https://host:port`` origins, shared by a client's threads:
    a request takes an idle connection of its origin (or opens one) and gives it back once the whole answer was
    read; a connection that failed is closed. Over TLS this spares a handshake per request (an etcd call on
    loopback: 2.4 ms with a new connection, most of it the handshake). Direct, never through a proxy: http.client
    reads no proxy from the environment."""

    IDLE_PER_ORIGIN = 4  # the agent's threads that call etcd at once: the feed, the lease, revokes of a teardown

    def __init__(self, context: ssl.SSLContext | None = None) -> None:
        self.context = context  # https:// origins: the CA and this client's certificate
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def open(self, origin: str, timeout: float) -> http.client.HTTPConnection:
        """A new connection to ``origin`` (connected by its first request), never kept: a stream's, for one."""
        scheme, _sep, address = origin.partition("://")
        if scheme == "https":
            return http.client.HTTPSConnection(address, timeout=timeout, context=self.context)
        return http.client.HTTPConnection(address, timeout=timeout)

    def post(self, origin: str, path: str, body: bytes, headers: dict[str, str],
             timeout: float) -> tuple[int, bytes]:
        """POST and read the whole answer: (status, body); raises OSError or http.client.HTTPException when no
        whole answer came (``timeout`` for the connection and for each read)."""
        return self.request("POST", origin, path, body, headers, timeout)

    def request(self, method: str, origin: str, path: str, body: bytes | None, headers: dict[str, str],
                timeout: float) -> tuple[int, bytes]:
        """``method`` on a kept connection, as ``post``."""
        while True:
            connection, kept = self._take(origin, timeout)
            try:
                connection.request(method, path, body=body, headers=headers)
                response = connection.getresponse()
                payload = response.read()
            except _CLOSED_WHILE_IDLE:
                connection.close()
                if kept:
                    continue  # closed by the server while idle: the next idle one, or a new connection
                raise
            except BaseException:
                connection.close()
                raise
            if response.will_close:
                connection.close()
            else:
                self._give(origin, connection)
            return response.status, payload

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()

    def _take(self, origin: str, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            idle = self._idle.get(origin)
            connection = idle.pop() if idle else None
        if connection is None:
            return self.open(origin, timeout), False
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        return connection, True

    def _give(self, origin: str, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if len(idle) < self.IDLE_PER_ORIGIN:
                idle.append(connection)
                return
        connection.close()


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
