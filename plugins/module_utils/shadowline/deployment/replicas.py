"""The deployment's nodes and the replicas they form (docs/fleet-design.md, the inventory contract).

``gms_engine.nnodes`` is the size of one replica (one engine group); ``gms_nodes`` holds R replicas of that many
nodes. Replica q is, in the nodes' order (``gms_node_rank``, 0..N-1 across the deployment), the nodes numbered
q·nnodes .. (q+1)·nnodes-1, unless every node names its replica and its rank in it (``gms_replica`` and
``gms_replica_rank``, all nodes or none). R = 1 is today's deployment: ``gms_node_rank`` is the node's rank.

``parse_placements`` reads each host's variables, ``arrange`` puts the nodes into replicas once nnodes is known;
each refusal is a Problem naming the field and the fix, and nothing is raised on bad input. A Node's ``rank`` is
its rank in its replica; the contract's nodes are in fleet order (replica 0's ranks, then replica 1's, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common.problems import Problem
from ..common.settings import Node
from ..common.values import Reader, as_int, describe
from .addresses import host_address

REPLICA_VARIABLES = ("gms_replica", "gms_replica_rank")
NODE_VARIABLES = ("gms_node_rank", "gms_node_address", *REPLICA_VARIABLES)  # host variables: one value per node
GUIDE = "docs/variables.md, Replicas"


@dataclass(frozen=True)
class Placement:
    """One host's place as its variables give it (before nnodes is known)."""
    host: str
    address: str
    node_rank: int | None  # gms_node_rank: the node's place in the deployment's order (optional with gms_replica)
    replica: int | None = None  # gms_replica (explicit placement only)
    replica_rank: int | None = None  # gms_replica_rank (explicit placement only)


def explicit(placements: list[Placement]) -> bool:
    return bool(placements) and placements[0].replica is not None


def default_nnodes(hostvars: dict[str, dict[str, Any]], node_hosts: list[str]) -> int:
    """gms_engine.nnodes when unset: every host of gms_nodes, or with gms_replica on every node, the hosts of one
    replica (the hosts over the replicas named, when they divide evenly)."""
    replicas = [as_int(hostvars.get(host, {}).get("gms_replica")) for host in node_hosts]
    if node_hosts and None not in replicas and len(node_hosts) % len(set(replicas)) == 0:
        return len(node_hosts) // len(set(replicas))
    return max(1, len(node_hosts))


def parse_placements(hostvars: dict[str, dict[str, Any]], node_hosts: list[str],
                     problems: list[Problem]) -> list[Placement] | None:
    """Every node's address and place, or None (with the problems) when one cannot be read. Without gms_replica
    the nodes' gms_node_rank must number them 0..N-1, each once (as for one engine group)."""
    twice = sorted({host for host in node_hosts if node_hosts.count(host) > 1})
    if twice:
        problems.append(Problem("gms_nodes", f"lists {', '.join(twice)} more than once; a node serves in one "
                                "replica, at one rank.", "list each host once in gms_nodes."))
        return None
    named = [h for h in node_hosts if any(v in hostvars.get(h, {}) for v in REPLICA_VARIABLES)]
    if named and not _all_named(hostvars, node_hosts, named, problems):
        return None
    placements: list[Placement] = []
    for host in node_hosts:
        read = Reader(problems, host)
        values = hostvars.get(host, {})
        if not named and "gms_node_rank" not in values:
            read.problem("gms_node_rank", "is not set.", f"give {host} a gms_node_rank (0 for the leader node).")
            continue
        rank = (read.integer("gms_node_rank", values["gms_node_rank"], minimum=0, example=0)
                if "gms_node_rank" in values else None)
        replica = _replica_number(read, host, values) if named else None
        replica_rank = (read.integer("gms_replica_rank", values["gms_replica_rank"], minimum=0, example=0)
                        if named else None)
        address = host_address(read, values, host)
        if address is None or ("gms_node_rank" in values and rank is None) or (
                named and (replica is None or replica_rank is None)):
            continue
        placements.append(Placement(host, address, rank, replica, replica_rank))
    if len(placements) != len(node_hosts):
        return None
    if not named and not _ranks_contiguous(placements, problems):
        return None
    return placements


def _all_named(hostvars: dict[str, dict[str, Any]], node_hosts: list[str], named: list[str],
               problems: list[Problem]) -> bool:
    """Either every node sets both gms_replica and gms_replica_rank, or none sets either."""
    lacking = {h: [v for v in REPLICA_VARIABLES if v not in hostvars.get(h, {})] for h in node_hosts}
    lacking = {h: missing for h, missing in lacking.items() if missing}
    if not lacking:
        return True
    listed = "; ".join(f"{h} lacks {' and '.join(missing)}" for h, missing in lacking.items())
    problems.append(Problem(
        "gms_replica", f"is set on {_hosts(named)}, but not everywhere: {listed}. Either every node of gms_nodes "
        "names its replica and its rank in it (gms_replica and gms_replica_rank), or none does and the replicas "
        "follow gms_node_rank (gms_engine.nnodes nodes each).",
        f"set gms_replica and gms_replica_rank on {_hosts(list(lacking))}, or remove both from every node "
        f"({GUIDE})."))
    return False


def _replica_number(read: Reader, host: str, values: dict[str, Any]) -> int | None:
    value = values.get("gms_replica")
    if isinstance(value, (list, tuple, set, dict)):
        read.problem("gms_replica", f"is {describe(value)}: a node belongs to one replica only.",
                     f"give {host} the number of its one replica (0, 1, ...).")
        return None
    return read.integer("gms_replica", value, minimum=0, example=0)


def _ranks_contiguous(placements: list[Placement], problems: list[Problem]) -> bool:
    """gms_node_rank numbers the nodes 0..N-1, each once: the deployment's order of nodes."""
    count = len(placements)
    by_rank: dict[int, list[str]] = {}
    for placement in sorted(placements, key=lambda p: p.node_rank or 0):
        by_rank.setdefault(placement.node_rank or 0, []).append(placement.host)
    duplicates = {rank: hosts for rank, hosts in by_rank.items() if len(hosts) > 1}
    for rank, hosts in sorted(duplicates.items()):
        problems.append(Problem("gms_node_rank", f"rank {rank} is given to {' and '.join(hosts)}; ranks must be unique.",
                                f"number the nodes 0..{count - 1}, each once."))
    missing = sorted(set(range(count)) - set(by_rank))
    extra = sorted(set(by_rank) - set(range(count)))
    if not duplicates and (missing or extra):
        problems.append(Problem("gms_node_rank",
                                f"ranks must be contiguous from 0 (exactly one leader, rank 0); "
                                f"got {sorted(by_rank)}, missing {missing}.",
                                f"number the {count} nodes 0..{count - 1}."))
    return not (duplicates or missing or extra)


def arrange(placements: list[Placement], nnodes: int, problems: list[Problem]) -> list[Node] | None:
    """The nodes in fleet order, each with its rank in its replica, or None with the problems: every replica has
    exactly ``nnodes`` nodes at ranks 0..nnodes-1, and the replicas are numbered 0..R-1."""
    if explicit(placements):
        return _arrange_named(placements, nnodes, problems)
    count = len(placements)
    if count % nnodes:
        short, whole = nnodes - count % nnodes, count // nnodes
        split = (f"{count} hosts are {whole} replica(s) and one more {short} node(s) short" if whole else
                 f"its one replica is {short} node(s) short")
        fix = (f"list {count + short} hosts in gms_nodes ({whole + 1} replicas) or {count - count % nnodes} "
               f"({whole}), or set gms_engine.nnodes to {count} (or leave it unset) for one replica of {count} nodes."
               if whole else f"set gms_engine.nnodes to {count} (or leave it unset), or list {nnodes} hosts in "
               "gms_nodes.")
        problems.append(Problem("gms_engine.nnodes", f"is {nnodes} but gms_nodes has {count} hosts. gms_engine.nnodes "
                                "is the size of one replica (one engine group), and gms_nodes holds whole replicas: "
                                f"{split}.", fix))
        return None
    ordered = sorted(placements, key=lambda p: p.node_rank or 0)
    return [Node(host=p.host, rank=index % nnodes, address=p.address) for index, p in enumerate(ordered)]


def _arrange_named(placements: list[Placement], nnodes: int, problems: list[Problem]) -> list[Node] | None:
    """The replicas gms_replica and gms_replica_rank name, checked: numbered 0..R-1, all of nnodes nodes, each
    rank once; gms_node_rank, where also set, is the node's place in the order they give."""
    found = len(problems)
    replicas: dict[int, list[Placement]] = {}
    for placement in placements:
        replicas.setdefault(placement.replica or 0, []).append(placement)
    missing = sorted(set(range(len(replicas))) - set(replicas))
    if missing:
        problems.append(Problem("gms_replica", f"numbers the replicas {sorted(replicas)}: replica(s) {missing} "
                                "have no node. Replicas are numbered 0..R-1, each with its nodes.",
                                f"number the {len(replicas)} replicas 0..{len(replicas) - 1} ({GUIDE})."))
    sizes = {q: len(members) for q, members in sorted(replicas.items())}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"replica {q} has {size} ({_hosts([p.host for p in replicas[q]])})"
                           for q, size in sizes.items())
        problems.append(Problem("gms_replica", f"gives replicas of different sizes: {listed}. Every replica is one "
                                f"engine group of gms_engine.nnodes ({nnodes}) nodes.",
                                f"give every replica {nnodes} nodes: move nodes between replicas with gms_replica, "
                                "or remove the extra ones from gms_nodes."))
    for q, members in sorted(replicas.items()):
        _check_replica(q, members, nnodes, problems)
    if len(problems) > found:
        return None
    nodes: list[Node] = []
    for q in sorted(replicas):
        for placement in sorted(replicas[q], key=lambda p: p.replica_rank or 0):
            place = q * nnodes + (placement.replica_rank or 0)
            if placement.node_rank is not None and placement.node_rank != place:
                problems.append(Problem(
                    "gms_node_rank", f"is {placement.node_rank}, but gms_replica {q} and gms_replica_rank "
                    f"{placement.replica_rank} put {placement.host} at place {place} of the deployment's nodes "
                    f"(replica by replica, rank by rank): out of order.",
                    f"remove gms_node_rank from {placement.host} (gms_replica and gms_replica_rank give the "
                    f"order), or set it to {place}.", host=placement.host))
            nodes.append(Node(host=placement.host, rank=placement.replica_rank or 0, address=placement.address))
    return None if len(problems) > found else nodes


def _check_replica(q: int, members: list[Placement], nnodes: int, problems: list[Problem]) -> None:
    """One replica: nnodes nodes at ranks 0..nnodes-1, each once."""
    hosts = _hosts([p.host for p in members])
    if len(members) < nnodes:
        problems.append(Problem("gms_replica", f"replica {q} has {len(members)} node(s) ({hosts}) but "
                                f"gms_engine.nnodes is {nnodes}: it is {nnodes - len(members)} node(s) short.",
                                f"give replica {q} {nnodes} nodes (gms_replica: {q} on more hosts), or set "
                                f"gms_engine.nnodes to {len(members)} if every replica has that many."))
    elif len(members) > nnodes:
        problems.append(Problem("gms_replica", f"replica {q} has {len(members)} nodes ({hosts}), more than "
                                f"gms_engine.nnodes ({nnodes}).",
                                f"move {len(members) - nnodes} of its nodes to another replica, or set "
                                f"gms_engine.nnodes to {len(members)} if every replica has that many."))
    by_rank: dict[int, list[str]] = {}
    for placement in members:
        by_rank.setdefault(placement.replica_rank or 0, []).append(placement.host)
    for rank, holders in sorted(by_rank.items()):
        if len(holders) > 1:
            problems.append(Problem("gms_replica_rank", f"rank {rank} of replica {q} is given to "
                                    f"{' and '.join(holders)}; each rank of a replica is one node.",
                                    f"number replica {q}'s nodes 0..{nnodes - 1}, each once."))
    wrong = sorted(set(by_rank) - set(range(nnodes)))
    missing = sorted(set(range(min(nnodes, len(members)))) - set(by_rank))
    if wrong or (missing and len(members) <= nnodes):
        problems.append(Problem("gms_replica_rank", f"replica {q}'s ranks must be 0..{nnodes - 1} (rank 0 is its "
                                f"leader node); got {sorted(by_rank)}" + (f", missing {missing}" if missing else "")
                                + ".", f"number replica {q}'s nodes 0..{nnodes - 1}, each once."))


def _hosts(hosts: list[str]) -> str:
    return hosts[0] if len(hosts) == 1 else f"{', '.join(hosts[:-1])} and {hosts[-1]}"
