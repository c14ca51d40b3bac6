"""A dynamo.mocker worker started ahead of time: ``python -m shadowline.standin.worker_launcher FD``.

A parked shadow starts this at standby. It imports ``dynamo.mocker.main`` (a third of a second of
Python imports: the cost a real shadow has already paid by holding its engine in memory), then
waits on the unix socket ``FD``. Nothing is registered and nothing listens until the leader,
having won the failover lock, sends ``{"argv": [...]}`` with the lock descriptor attached; then it
runs the mocker's ``main()`` with those arguments in this very process. If the leader goes away
first (EOF), it exits without having started anything.
"""

from __future__ import annotations

import os
import socket
import sys

from . import unix_messages


def main() -> int:
    control = socket.socket(fileno=int(sys.argv[1]))
    from dynamo.mocker import main as mocker_main  # the slow part, done while parked

    try:
        unix_messages.send(control, {"warm": True})
    except OSError:
        pass  # the leader may already have sent its order and closed its end: the order is still queued
    try:
        msg, fds = unix_messages.recv(control)
    except (unix_messages.ConnectionClosed, OSError):
        return 0  # the leader went away before it won the lock: nothing was started
    lock_fds = list(fds)  # held for the life of the worker, like an inherited descriptor
    control.close()
    sys.argv = ["dynamo.mocker", *msg["argv"]]
    mocker_main.main()
    for fd in lock_fds:
        os.close(fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
