"""The deployment's spare nodes (docs/fleet-design.md, the inventory contract; issue #40).

``gms_spares`` is an inventory group of hosts that run the runtime, a GMS server of the deployment's model
revision and an agent, and hold no rank: relocation gives one a rank of a replica whose node was lost (the
membership record, control/membership.py). A spare runs the plan its deployment's nodes give, and their roles:
it carries the nodes' variables (group_vars/all, or a group_vars/gms_spares.yml that is the nodes' file); it is
checked by preflight like a node (GPUs, memory budget, platform, Python).

``parse_spares`` reads the group: each spare's address, refusals each naming the field and the fix (a host that
is both a node and a spare, a spare that sets a node's rank or replica, a spare whose deployment variables are
not the nodes', missing or different), and ``check_pool`` ``gms_failover.min_spares`` against the pool's size.
A spare is a ``Node`` of rank 0 (its rank is the membership's to give).
"""

from __future__ import annotations

from typing import Any

from ..common.problems import Problem
from ..common.settings import Node
from ..common.values import Reader
from .addresses import host_address
from .replicas import NODE_VARIABLES

SPARES_GROUP = "gms_spares"
GUIDE = "docs/fleet.md, Spare nodes"


def parse_spares(hostvars: dict[str, dict[str, Any]], spare_hosts: list[str], node_hosts: list[str],
                 shared: dict[str, Any], problems: list[Problem]) -> list[Node] | None:
    """The spares in the group's order, or None (with the problems) when one cannot be taken. ``shared``: the
    nodes' shared variables and their python_env_mode, None where unset (a spare has the same, since it runs
    their plan and their roles)."""
    found = len(problems)
    spares: list[Node] = []
    for host in spare_hosts:
        values = hostvars.get(host, {})
        read = Reader(problems, host)
        if host in node_hosts:
            problems.append(Problem(SPARES_GROUP, f"{host} is both a node (gms_nodes) and a spare: a node holds a "
                                    "rank of its replica, a spare holds none until it replaces a lost node.",
                                    f"remove {host} from gms_spares or from gms_nodes ({GUIDE}).", host=host))
            continue
        ranked = [name for name in NODE_VARIABLES if name in values and name != "gms_node_address"]
        for name in ranked:
            read.problem(name, f"is set on the spare {host}: a spare holds no rank and no replica until relocation "
                         "gives it one (the replica's membership record).",
                         f"remove {name} from {host}, or move {host} to gms_nodes to make it a node.")
        for name, wanted in sorted(shared.items()):
            if values.get(name) != wanted:
                said = ("is set on the spare, not on the nodes" if wanted is None else
                        "is not set on the spare, as it is on the nodes" if name not in values else
                        "differs between the nodes and the spare")
                read.problem(name, f"{said}: a spare runs the nodes' plan and roles, and takes the place of any of "
                             "them.",
                             f"give gms_spares the variables of gms_nodes: set them for both (group_vars/all), or "
                             f"make group_vars/gms_spares.yml the same file as gms_nodes.yml ({GUIDE}).")
        address = host_address(read, values, host)
        if address is not None and not ranked:
            spares.append(Node(host=host, rank=0, address=address))
    return None if len(problems) > found else spares


def check_pool(read: Reader, min_spares: int, spares: list[Node]) -> None:
    """gms_failover.min_spares: the pool's size the deployment wants at least (0: spares optional)."""
    if min_spares > len(spares):
        have = f"{len(spares)} host(s) ({', '.join(s.host for s in spares)})" if spares else "no host"
        read.problem("gms_failover.min_spares", f"is {min_spares}, but gms_spares has {have}: relocation after a "
                     "lost node needs a spare to move the rank to.",
                     f"add {min_spares - len(spares)} more host(s) to gms_spares, or set gms_failover.min_spares to "
                     f"{len(spares)} ({GUIDE}).")
