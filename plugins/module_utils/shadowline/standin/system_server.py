"""An engine's system HTTP server on ``DYN_SYSTEM_HOST:DYN_SYSTEM_PORT``: /health, /live, /metrics.

``/health`` answers 503 ``{"status":"notready"}`` until the engine reaches standby (upstream's
startup probe), then 200 ``{"status":"ready",...}``; like vLLM's, it stays 200 when a rank of the
engine died or hangs. ``/metrics`` carries the failover metrics, the stand-in's collective
metrics and, once the worker runs, the worker's own Dynamo metrics. Any other GET is forwarded to
the worker's system port (model card files), 404 while there is no worker.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

log = logging.getLogger("shadowline.standin.system")

HealthFn = Callable[[], "tuple[int, dict]"]
MetricsFn = Callable[[], str]
ProxyFn = Callable[[str], "tuple[int, dict[str, str], bytes] | None"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gave up (timeout, reset) is not the engine's problem


def serve(host: str, port: int, health: HealthFn, metrics: MetricsFn, proxy: ProxyFn) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            if path == "/health":
                code, doc = health()
                self._reply(code, json.dumps(doc).encode(), "application/json")
            elif path == "/live":
                self._reply(200, b'{"status":"live"}', "application/json")
            elif path == "/metrics":
                self._reply(200, metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
            else:
                got = proxy(self.path)
                if got is None:
                    self._reply(404, b"not found\n", "text/plain")
                else:
                    code, headers, body = got
                    self._reply(code, body, headers.get("Content-Type", "application/octet-stream"))

        def log_message(self, fmt: str, *args: object) -> None:
            pass

    _Server.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server = _Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="system-http", daemon=True).start()
    log.info("system server listening on %s:%d (/health, /live, /metrics)", host, port)
    return server
