"""The one check of a network address a deployment renders into configuration (issue #13).

Node and infra addresses end up in etcd's and NATS's configuration, unit files, the Slurm script and firewall
rules: each must be an IP address or a DNS host name, nothing else (a quote, a space or a newline would change
the file it lands in). Preflight, the contract and slurm/render all check through ``address_problem``.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from ..common.values import Reader

# the Slurm script's address of node <i>, filled in from the allocation at run time (slurm/job.py)
PLACEHOLDER_RE = re.compile(r"@SL_ADDR_(\d+)@")
_LABEL_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")  # '_' as inventories use it
ADDRESS_FIX = "set it to the node's IP address (10.0.0.5, fd00::5) or DNS host name (gpu-01.cluster.example)"


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def is_hostname(value: str) -> bool:
    name = value[:-1] if value.endswith(".") else value
    return 0 < len(name) <= 253 and all(_LABEL_RE.match(label) for label in name.split("."))


def address_problem(value: Any, *, placeholder_ok: bool = True) -> str | None:
    """None when ``value`` is an IP address or a DNS host name (or the Slurm placeholder), else what is wrong."""
    if not isinstance(value, str) or not value:
        return f"must be an IP address or host name, got {value!r}."
    if is_ip(value) or is_hostname(value):
        return None
    if placeholder_ok and PLACEHOLDER_RE.fullmatch(value):
        return None
    return f"{value!r} is neither an IP address nor a DNS host name (no spaces, quotes or control characters)."


def address_source(values: dict[str, Any], host: str) -> tuple[str, Any]:
    """Where a host's cluster address comes from and what it is: gms_node_address, else ansible_host, else the
    inventory name (reported as gms_node_address, the variable to set)."""
    field_name = next((f for f in ("gms_node_address", "ansible_host") if values.get(f)), "gms_node_address")
    return field_name, values.get(field_name) or host


def host_address(read: Reader, values: dict[str, Any], host: str) -> str | None:
    """A host's cluster address (gms_node_address, else ansible_host, else its inventory name), checked."""
    field_name, address = address_source(values, host)
    wrong = address_problem(address)
    if wrong is not None:
        read.problem(field_name, wrong, f"{ADDRESS_FIX}: it is written into etcd's, NATS's and the units' "
                     "configuration.")
        return None
    return address


def same_address(address: str) -> str:
    """An address as a key: one spelling per IP address (fd00::05 is fd00::5), host names without case or the
    root's dot."""
    try:
        return ipaddress.ip_address(address).compressed
    except ValueError:
        return address.lower().rstrip(".")
