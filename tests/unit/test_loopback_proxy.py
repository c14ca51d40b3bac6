"""tests/loopback.py's CuttingProxy reads a whole request before it forwards it (a request whose headers and body
arrive apart made etcd wait for the body until the proxy's timeout: a CI failure of test_etcd_resilience)."""

from __future__ import annotations

import socket
import threading
import time

from tests.loopback import read_request


def test_a_request_whose_body_arrives_after_its_headers_is_read_whole() -> None:
    body = b'{"key": "L3NoYWRvd2xpbmU="}'
    head = (b"POST /v3/kv/range HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.settimeout(5)

        def send() -> None:
            theirs.sendall(head[:20])
            time.sleep(0.05)
            theirs.sendall(head[20:])
            time.sleep(0.05)
            theirs.sendall(body)

        sender = threading.Thread(target=send)
        sender.start()
        assert read_request(ours) == head + body
        sender.join()
