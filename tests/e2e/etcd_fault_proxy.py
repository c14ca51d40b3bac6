"""A TCP proxy put in front of etcd by the fault matrix (inside a testbed host, behind an nftables redirect of the
other hosts' etcd traffic): ``--delay S`` holds every answer S seconds (a slow etcd), ``--cut N`` cuts every N-th
connection's answer in half and closes it (answers cut short). Stdlib only: it runs with the host's python3.

    python3 etcd_fault_proxy.py --listen 198.18.8.10:23790 --to 198.18.8.10:2379 --delay 1.5
"""

from __future__ import annotations

import argparse
import socket
import threading
import time


def relay(source: socket.socket, sink: socket.socket, delay: float, cut: bool) -> None:
    """Copy ``source`` to ``sink`` (the answer ``delay`` seconds late: its first chunk waits; with ``cut``, half of
    the first chunk and then close both), until either side closes."""
    try:
        while True:
            chunk = source.recv(65536)
            if not chunk:
                break
            if delay:
                time.sleep(delay)
                delay = 0.0
            if cut:
                sink.sendall(chunk[: max(1, len(chunk) // 2)])
                break
            sink.sendall(chunk)
    except OSError:
        pass
    for sock in (source, sink):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(listen: tuple[str, int], target: tuple[str, int], delay: float, cut_every: int) -> None:
    server = socket.create_server(listen, reuse_port=False)
    count = 0
    while True:
        client, _unused = server.accept()
        count += 1
        try:
            upstream = socket.create_connection(target, timeout=5)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        cut = bool(cut_every) and count % cut_every == 0
        threading.Thread(target=relay, args=(client, upstream, 0.0, False), daemon=True).start()
        threading.Thread(target=relay, args=(upstream, client, delay, cut), daemon=True).start()


def address(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--listen", type=address, required=True)
    parser.add_argument("--to", type=address, required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--cut", type=int, default=0)
    args = parser.parse_args()
    serve(args.listen, args.to, args.delay, args.cut)


if __name__ == "__main__":
    main()
