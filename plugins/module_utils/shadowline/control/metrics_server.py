"""The agent's HTTP endpoint: ``/metrics`` (Prometheus) and ``/health`` (200 while the loop ticks).

Bounded so that no client can hurt the agent: at most ``MAX_CONNECTIONS`` requests are served at once (a
connection beyond them is closed at once), a connection that sends nothing is dropped after
``IDLE_TIMEOUT_S``, and the server waits with poll (selectors), so descriptor numbers above 1024 are fine.
With a TLS context (control/access.agent_server_context) the TLS handshake happens in the request's own thread,
under the same timeout and bound: a client that never completes it holds one slot, never the accept loop.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_CONNECTIONS = 32
IDLE_TIMEOUT_S = 5.0
CONTENT_TYPE_TEXT = "text/plain; charset=utf-8"


class BoundedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int = MAX_CONNECTIONS, context: ssl.SSLContext | None = None) -> None:
        self.slots = threading.BoundedSemaphore(max_connections)
        self.turned_away = 0
        self.context = context
        super().__init__(address, handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self.context is not None:  # handshake later, in the request's thread (finish_request)
            sock = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.context is not None:
            request.settimeout(IDLE_TIMEOUT_S)
            try:
                request.do_handshake()
            except (OSError, ssl.SSLError):
                return  # no certificate of the deployment's CA, or no handshake in time: nothing served
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


def serve(address: str, port: int, metrics: Callable[[], tuple[bytes, str]],
          healthy: Callable[[], bool], context: ssl.SSLContext | None = None) -> BoundedHTTPServer:
    """Serve in a thread; ``metrics()`` gives (body, content type), ``healthy()`` whether the loop ticks;
    ``context``: TLS (None: plain HTTP)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = IDLE_TIMEOUT_S  # per socket operation: an idle or slow client is dropped

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
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = BoundedHTTPServer((address, port), Handler, context=context)
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="metrics",
                     daemon=True).start()
    return server
