"""sd_notify(3) for a ``Type=notify`` unit with ``WatchdogSec``: READY=1 once the agent runs its loop, WATCHDOG=1
from the loop, so that systemd restarts an agent whose loop hangs (not only one that exits).

Stdlib only (a datagram to ``$NOTIFY_SOCKET``): the agent runs from the engines' runtime, which need not have
python-systemd. Outside systemd (no ``$NOTIFY_SOCKET``: a test, a Slurm step) every call does nothing.
"""

from __future__ import annotations

import os
import socket
import time


class SystemdNotifier:
    def __init__(self) -> None:
        address = os.environ.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):  # an abstract socket
            address = "\0" + address[1:]
        self.address = address
        usec = os.environ.get("WATCHDOG_USEC", "")
        watchdog_pid = os.environ.get("WATCHDOG_PID", "")
        mine = not watchdog_pid or watchdog_pid == str(os.getpid())
        # ping at a quarter of the watchdog period: a loop late by less than that never trips it
        self.ping_every = int(usec) / 4e6 if usec.isdigit() and int(usec) > 0 and mine else None
        self.next_ping = 0.0

    def send(self, message: str) -> bool:
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message.encode(), self.address)
        except OSError:
            return False
        return True

    def ready(self, status: str = "") -> None:
        self.send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def alive(self) -> None:
        """WATCHDOG=1, at most every quarter of the watchdog period (the loop calls it every tick)."""
        if self.ping_every is None:
            return
        now = time.monotonic()
        if now >= self.next_ping:
            self.next_ping = now + self.ping_every
            self.send("WATCHDOG=1")

    def stopping(self) -> None:
        self.send("STOPPING=1")
