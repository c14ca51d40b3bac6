"""What the testbed still holds on the machine (processes, connections, mounts, namespaces, links, cgroups, files)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .cgroups import cgroup_pids, testbed_cgroup_dirs
from .helpers import comm
from .mounts import testbed_mounts
from .names import INVENTORY, KNOWN_HOSTS, PREFIX, STATE_JSON, STATE_ROOT
from .network import netns_pids, testbed_links, testbed_netns


def leaks() -> list[str]:
    """Everything of the testbed still on the machine; empty when clean."""
    found = [f"process {p} in a testbed cgroup: {comm(p)}" for p in sorted(cgroup_pids(testbed_cgroup_dirs()))]
    found += [f"process {p} in a testbed network namespace: {comm(p)}" for p in sorted(netns_pids())]
    found += [f"process {p} connected to a testbed address: {comm(p)}"
              for p in sorted(processes_connected_to_testbed())]
    found += [f"mount {m}" for m in testbed_mounts()]
    found += [f"network namespace {n}" for n in testbed_netns()]
    found += [f"link {n}" for n in testbed_links()]
    found += [f"cgroup {d}" for d in testbed_cgroup_dirs()]
    if STATE_ROOT.exists():
        found.append(f"state directory {STATE_ROOT}")
    found += [f"generated file {p}" for p in (INVENTORY, STATE_JSON, KNOWN_HOSTS) if p.exists()]
    return found


def testbed_socket_inodes() -> set[str]:
    """Inodes of the machine's TCP sockets connected to a testbed address (root network namespace)."""
    inodes = set()
    prefix = "".join(f"{int(octet):02X}" for octet in reversed(PREFIX.split(".")))  # /proc/net/tcp byte order
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:  # the testbed is IPv4 only
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if remote[2:8] == prefix and state != "0A" and inode != "0":  # 0A: listening
            inodes.add(inode)
    return inodes


def processes_connected_to_testbed() -> set[int]:
    """Machine processes (e.g. ssh ControlPersist masters) holding a TCP connection to a testbed host."""
    inodes = testbed_socket_inodes()
    if not inodes:
        return set()
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    pids.add(int(proc.name))
                    break
    return pids
