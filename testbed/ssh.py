"""ssh into the hosts: the testbed's key pair, sshd's drop-in, and the wait for sshd's banner."""

from __future__ import annotations

import socket

from .helpers import run, wait_until
from .journal import Host
from .names import KEY_FILE, SSH_PORT, TESTBED_DIR

SSHD_CONF = """# Written by testbed/testbed.py: listen on the host's own address, root by key only.
ListenAddress {address}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""


def ensure_key() -> str:
    TESTBED_DIR.mkdir(mode=0o700, exist_ok=True)
    if not KEY_FILE.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "shadowline-testbed", "-f", str(KEY_FILE)])
    return KEY_FILE.with_suffix(".pub").read_text()


def ssh_banner(address: str) -> bool:
    try:
        with socket.create_connection((address, SSH_PORT), timeout=1) as conn:
            conn.settimeout(1)
            return conn.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def wait_sshd(hosts: list[Host], timeout: float) -> None:
    for host in hosts:
        wait_until(f"sshd on {host.name} ({host.address}:{SSH_PORT})", timeout, lambda: ssh_banner(host.address))
