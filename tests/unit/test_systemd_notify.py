"""The agent's sd_notify: READY=1 and WATCHDOG=1 datagrams reach $NOTIFY_SOCKET (a socket of the test's own, as
systemd's would be), pings are paced by the watchdog period, and nothing happens outside systemd."""

from __future__ import annotations

import os
import socket

from shadowline.common.systemd_notify import SystemdNotifier


def test_ready_and_watchdog_reach_the_notify_socket(tmp_path, monkeypatch):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        server.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        monkeypatch.setenv("WATCHDOG_USEC", "20000000")
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
        notifier = SystemdNotifier()
        assert notifier.ping_every == 5.0
        notifier.ready("watching 2 ranks")
        assert server.recv(256) == b"READY=1\nSTATUS=watching 2 ranks"
        notifier.alive()
        notifier.alive()  # within the quarter period: not sent again
        notifier.stopping()
        assert server.recv(256) == b"WATCHDOG=1"
        assert server.recv(256) == b"STOPPING=1"


def test_outside_systemd_nothing_is_sent(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "20000000")
    monkeypatch.setenv("WATCHDOG_PID", "1")  # another process's watchdog: not ours to ping
    notifier = SystemdNotifier()
    assert notifier.ping_every is None and notifier.send("READY=1") is False
