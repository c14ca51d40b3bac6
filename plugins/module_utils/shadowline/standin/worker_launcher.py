"""A dynamo.mocker worker started ahead of time: ``python -m shadowline.standin.worker_launcher FD [ARG...]``.

A parked shadow starts this at standby with the mocker's arguments. It imports ``dynamo.mocker.main`` (a third of
a second of Python imports: the cost a real shadow has already paid by holding its engine in memory) and creates
the worker's Dynamo runtime, as a real shadow's dynamo.vllm does before it loads its model and parks (its
``DistributedRuntime``: the etcd session and lease, the NATS connection, with their TLS handshakes and etcd's
authentication; its system server, whose endpoint health stays ``notready``). Then it waits on the unix socket
``FD``. Nothing is registered in discovery until the leader, having won the failover lock, sends ``{"argv":
[...]}`` with the lock descriptor attached; then it runs the mocker's ``worker()`` in this very process and event
loop, which takes the runtime made while parked instead of making one, and registers. If the leader goes away
first (EOF), it exits without having registered anything.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from typing import Any

from . import unix_messages


def main() -> int:
    control = socket.socket(fileno=int(sys.argv[1]))
    parked_argv = sys.argv[2:]
    import uvloop
    from dynamo.mocker import main as mocker_main  # the slow part, done while parked

    return uvloop.run(park(control, mocker_main, parked_argv))


async def park(control: socket.socket, mocker_main: Any, argv: list[str]) -> int:  # noqa: ANN401 (Dynamo's module)
    loop = asyncio.get_running_loop()
    sys.argv = ["dynamo.mocker", *argv]
    early = made = None
    if argv:  # the mocker's own parse of its arguments decides its planes, as it will at wake
        args = mocker_main.parse_args()
        early = (args.discovery_backend, args.request_plane, args.event_plane, args.response_plane)
        made, _loop = mocker_main.create_runtime(*early[:3], response_plane=early[3])
    try:
        unix_messages.send(control, {"warm": True})
    except OSError:
        pass  # the leader may already have sent its order and closed its end: the order is still queued
    try:
        msg, fds = await loop.run_in_executor(None, unix_messages.recv, control)
    except (unix_messages.ConnectionClosed, OSError):
        if made is not None:
            made.shutdown()
        return 0  # the leader went away before it won the lock: nothing was registered
    lock_fds = list(fds)  # held for the life of the worker, like an inherited descriptor
    control.close()
    sys.argv = ["dynamo.mocker", *msg["argv"]]
    make_runtime = mocker_main.create_runtime

    def runtime_made_while_parked(discovery_backend: str, request_plane: str, event_plane: str | None = None,
                                  use_kv_events: bool | None = None, response_plane: str = "tcp") -> Any:  # noqa: ANN401
        nonlocal made
        if made is not None and (discovery_backend, request_plane, event_plane, response_plane) == early:
            runtime, made = made, None
            return runtime, loop
        return make_runtime(discovery_backend, request_plane, event_plane, use_kv_events, response_plane)

    mocker_main.create_runtime = runtime_made_while_parked
    try:
        await mocker_main.worker()
    finally:
        if made is not None:  # the order's arguments chose other planes: the parked runtime was not used
            made.shutdown()
        for fd in lock_fds:
            os.close(fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
