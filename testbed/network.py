"""The network: the bridge, one namespace and veth per host, and their removal (also /run/netns)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .helpers import run
from .journal import Host, State
from .mounts import is_mountpoint
from .names import BRIDGE, BRIDGE_ADDRESS, NAME_PREFIX, NETNS_DIR


def link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def testbed_links() -> list[str]:
    return sorted(n for n in os.listdir("/sys/class/net") if n == BRIDGE or n.startswith(NAME_PREFIX))


def testbed_netns() -> list[str]:
    out = run(["ip", "netns", "list"], check=False).stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.startswith(NAME_PREFIX))


def make_bridge() -> None:
    if not link_exists(BRIDGE):
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "addr", "replace", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def make_host_network(host: Host) -> None:
    """netns sl-nodeI; veth sl-nodeI on the bridge, its peer eth0 in the netns; no route but the /24."""
    if host.netns not in testbed_netns():
        run(["ip", "netns", "add", host.netns])
    if not link_exists(host.veth):
        run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns])
    run(["ip", "link", "set", host.veth, "master", BRIDGE, "up"])
    inside = ["ip", "-n", host.netns]
    run([*inside, "link", "set", "lo", "up"])
    run([*inside, "addr", "replace", f"{host.address}/24", "dev", "eth0"])
    run([*inside, "link", "set", "eth0", "up"])


def record_run_netns(state: State) -> None:
    """`ip netns add` creates /run/netns and makes it a mount point; down() undoes what was not there before."""
    state.run_netns_created = not NETNS_DIR.exists()
    state.run_netns_mounted = not is_mountpoint(NETNS_DIR)


def netns_pids() -> set[int]:
    pids: set[int] = set()
    for name in testbed_netns():
        out = run(["ip", "netns", "pids", name], check=False).stdout
        pids.update(int(p) for p in out.split())
    return pids


def delete_network(state: State | None) -> None:
    hosts = state.hosts if state else []
    links = {h.veth for h in hosts} | {n for n in testbed_links() if n != BRIDGE}
    for link in sorted(links):
        if link_exists(link):
            run(["ip", "link", "del", link], check=False)
    for name in sorted({h.netns for h in hosts} | set(testbed_netns())):
        if (NETNS_DIR / name).exists():
            run(["ip", "netns", "del", name])
    if link_exists(BRIDGE):
        run(["ip", "link", "del", BRIDGE])
    restore_run_netns(state)


def restore_run_netns(state: State | None) -> None:
    if state is None or not NETNS_DIR.is_dir() or any(NETNS_DIR.iterdir()):
        return  # still in use by other network namespaces of the machine
    if state.run_netns_mounted and is_mountpoint(NETNS_DIR):
        run(["umount", str(NETNS_DIR)], check=False)
    if state.run_netns_created and not is_mountpoint(NETNS_DIR):
        with contextlib.suppress(OSError):
            NETNS_DIR.rmdir()
