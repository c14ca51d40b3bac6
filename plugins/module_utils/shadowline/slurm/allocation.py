"""The job's allocation and the rendered plan made concrete: node names, addresses, the spec in the script.

``scontrol show hostnames "$SLURM_JOB_NODELIST"`` gives the nodes in allocation order; node i takes the plan's
placeholder node ``slurm-node-<i>`` (its address token ``@SL_ADDR_<i>@``). A node's address is its Slurm
``NodeAddr`` when that is an IP address, else what the name resolves to (IPv4 first): etcd and the engines
bind to it, so it must be an address, not a name.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import subprocess
from dataclasses import dataclass
from typing import Any

from ..deployment.addresses import PLACEHOLDER_RE, address_problem

SPEC_BEGIN = ": <<'SHADOWLINE_SPEC'"
SPEC_END = "SHADOWLINE_SPEC"


class AllocationError(Exception):
    pass


@dataclass(frozen=True)
class Node:
    name: str
    address: str


def read_spec(script_text: str) -> dict[str, Any]:
    """The JSON spec (plan with address tokens, Slurm options) embedded in a rendered batch script."""
    lines = script_text.splitlines()
    try:
        start = lines.index(SPEC_BEGIN)
        end = lines.index(SPEC_END, start + 1)
    except ValueError:
        raise AllocationError("the script has no SHADOWLINE_SPEC block: render it with slurm/render") from None
    return json.loads("\n".join(lines[start + 1:end]))


def concrete(value: Any, nodes: list[Node]) -> Any:
    """``value`` (the plan, or any part of it) with every address token replaced by the node's address."""
    text = json.dumps(value)

    def address(match: re.Match[str]) -> str:
        index = int(match.group(1))
        if index >= len(nodes):
            raise AllocationError(f"the plan names node {index} but the allocation has {len(nodes)} node(s)")
        wrong = address_problem(nodes[index].address, placeholder_ok=False)
        if wrong is not None:
            raise AllocationError(f"node {nodes[index].name}'s address {wrong}")
        return nodes[index].address

    return json.loads(PLACEHOLDER_RE.sub(address, text))


def hostnames(nodelist: str) -> list[str]:
    out = _run(["scontrol", "show", "hostnames", nodelist])
    return [line.strip() for line in out.splitlines() if line.strip()]


def node_addresses(names: list[str]) -> dict[str, str]:
    """NodeAddr of each node (``scontrol show node -o``), resolved to an IP address."""
    out = _run(["scontrol", "show", "node", "-o", ",".join(names)])
    found: dict[str, str] = {}
    for line in out.splitlines():
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        if fields.get("NodeName") in names:
            found[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return {name: resolve(found.get(name, name)) for name in names}


def resolve(name: str) -> str:
    try:
        ipaddress.ip_address(name)
        return name
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError as err:
        raise AllocationError(f"cannot resolve node address {name!r}: {err}") from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0])


def allocation(nodelist: str) -> list[Node]:
    names = hostnames(nodelist)
    if not names:
        raise AllocationError(f"scontrol found no node in {nodelist!r}")
    addresses = node_addresses(names)
    return [Node(name, addresses[name]) for name in names]


def _run(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise AllocationError(f"{' '.join(argv)}: {err}") from None
    if proc.returncode != 0:
        raise AllocationError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return proc.stdout
