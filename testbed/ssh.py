"""ssh into the hosts: the testbed's key pair, each host's own host key and the known_hosts that lists them,
sshd's drop-in, and the wait for sshd's banner."""

from __future__ import annotations

import socket
from pathlib import Path

from .helpers import run, wait_until
from .journal import Host, State
from .names import KEY_FILE, KNOWN_HOSTS, SSH_PORT, TESTBED_DIR

# A host's own host key, made in its overlay's upper directory on `up` (it survives a reboot, goes with `down`):
# the machine's keys, which the overlay would show every host, are not offered.
HOST_KEY = "etc/ssh/shadowline-testbed_host_ed25519_key"

SSHD_CONF = """# Written by testbed/testbed.py: listen on the host's own address, root by key only, the host's own key.
ListenAddress {address}
HostKey /{host_key}
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


def host_key_path(host: Host) -> Path:
    """Where the host's private host key lies on the machine (its upper directory); the public one beside it."""
    return host.dir / "upper" / HOST_KEY


def make_host_key(host: Host) -> None:
    """The host's ed25519 host key in its upper directory (before it boots), a new one each time."""
    key = host_key_path(host)
    for path in (key, key.with_suffix(".pub")):
        path.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{host.name}.shadowline-testbed", "-f", str(key)])


def known_hosts_text(state: State) -> str:
    """A known_hosts line per host (name and address) with its own public host key."""
    return "".join(f"{host.name},{host.address} {host_key_path(host).with_suffix('.pub').read_text()}"
                   for host in state.hosts)


def write_known_hosts(state: State) -> None:
    KNOWN_HOSTS.write_text(known_hosts_text(state))


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
