"""The agent's HTTP endpoint: ``/metrics`` (Prometheus), ``/health`` (200 while the loop ticks) and, for the other
nodes' agents, ``POST /notice`` (a failure they declared: control/failure_notices.py).

Bounded so that no client can hurt the agent: at most ``MAX_CONNECTIONS`` connections (and one per other node,
whose agent keeps one open for its notices) are served at once (a connection beyond them is closed at once), a
connection that sends nothing is dropped after ``IDLE_TIMEOUT_S`` (a node's after ``long_idle_s``), a request body
is at most ``MAX_BODY`` bytes, and the server waits with poll (selectors), so descriptor numbers above 1024 are
fine. With a TLS context (cluster/access.agent_server_context) the TLS handshake happens in the connection's own
thread, under the same timeout and bound: a client that never completes it holds one slot, never the accept loop.
Connections are kept alive (HTTP/1.1).
"""

from __future__ import annotations

import socket
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Tuple

MAX_CONNECTIONS = 32
IDLE_TIMEOUT_S = 5.0
MAX_BODY = 4096
CONTENT_TYPE_TEXT = "text/plain; charset=utf-8"
NOTICE_PATH = "/notice"  # another node's agent's failure notice (failure_notices.py)


@dataclass(frozen=True)
class Peer:
    """Who sent a request to the endpoint: its address, and the common name of its client certificate (None over
    plain HTTP)."""
    address: str
    common_name: str | None = None


Poster = Callable[[bytes, Peer], Tuple[int, str]]  # (body, who sent it) -> (status, text)


def peer_of(request: Any, client_address: Any) -> Peer:
    """Who is on the other end of a connection: its address, and its client certificate's common name over TLS."""
    name = None
    if isinstance(request, ssl.SSLSocket):
        for attribute in (request.getpeercert() or {}).get("subject", ()):
            for key, value in attribute:
                if key == "commonName":
                    name = value
    return Peer(str(client_address[0]), name)


class BoundedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],  # noqa: PLR0913 (the server's bounds, each with a default)
                 max_connections: int = MAX_CONNECTIONS, context: ssl.SSLContext | None = None,
                 long_lived: Callable[[Peer], bool] | None = None, long_idle_s: float = IDLE_TIMEOUT_S) -> None:
        self.slots = threading.BoundedSemaphore(max_connections)
        self.turned_away = 0
        self.context = context
        self.long_lived = long_lived
        self.long_idle_s = long_idle_s
        super().__init__(address, handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self.context is not None:  # handshake later, in the request's thread (finish_request)
            sock = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(IDLE_TIMEOUT_S)
        if self.context is not None:
            try:
                request.do_handshake()
            except (OSError, ssl.SSLError):
                return  # no certificate of the deployment's CA, or no handshake in time: nothing served
        if self.long_lived is not None and self.long_lived(peer_of(request, client_address)):
            request.settimeout(self.long_idle_s)  # another node's agent, keeping its connection for notices
        super().finish_request(request, client_address)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.turned_away += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def serve(address: str, port: int, metrics: Callable[[], tuple[bytes, str]],  # noqa: PLR0913 (one argument per part of the endpoint)
          healthy: Callable[[], bool], context: ssl.SSLContext | None = None, notices: Poster | None = None,
          peers: Callable[[Peer], bool] | None = None, peer_idle_s: float = IDLE_TIMEOUT_S,
          peer_count: int = 0) -> BoundedHTTPServer:
    """Serve in a thread; ``metrics()`` gives (body, content type), ``healthy()`` whether the loop ticks;
    ``context``: TLS (None: plain HTTP); ``notices(body, peer)`` answers ``POST /notice`` (None: 404);
    ``peers(peer)`` says whether a connection is another node's agent (kept open ``peer_idle_s``, and
    ``peer_count`` slots more for them)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = None  # set per connection by the server (finish_request): an idle or slow client is dropped
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            if self.path == "/metrics":
                body, content_type = metrics()
                status = 200
            elif self.path == "/health":
                ok = healthy()
                body, content_type, status = (b"ok\n" if ok else b"loop stalled\n"), CONTENT_TYPE_TEXT, \
                    (200 if ok else 503)
            else:
                self.send_error(404)
                return
            self.answer(status, body, content_type)

        def do_POST(self) -> None:  # noqa: N802 (http.server API)
            if self.path != NOTICE_PATH or notices is None:
                self.send_error(404)
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self.send_error(411)
                return
            if not 0 <= length <= MAX_BODY:
                self.send_error(413)
                return
            status, text = notices(self.rfile.read(length), peer_of(self.connection, self.client_address))
            self.answer(status, text.encode() + b"\n", CONTENT_TYPE_TEXT)

        def answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = BoundedHTTPServer((address, port), Handler, MAX_CONNECTIONS + peer_count, context, peers, peer_idle_s)
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="metrics",
                     daemon=True).start()
    return server
