"""Every port a deployment uses, computed in one place, and the one check of them.

Cohort ports follow the upstream recipe: master port ``master_base + master_stride * cohort``, system
port ``system_base + cohort``, NIXL side channel ``nixl_base + cohort``. Infra ports (etcd, NATS,
frontend) are fixed per deployment. ``port_problems`` checks them where they are bound: two processes of the
plan on one host with one port (the leader node also being the infra host, by default) are refused; the same
number on two different hosts is no collision. The plan builder (plan_builder.build_plan) runs it, so every path that
builds a plan (preflight, shadowline.gms.cohort_plan and the CLI's plan, slurm/render) refuses the same ports.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common.problems import Problem
from ..common.settings import CohortPorts, Ports
from .contract import ETCD_MEMBER_COUNTS, Contract

# Where a port is bound (PortUse.where): which of the deployment's hosts run its process.
ALL_NODES, LEADER_NODE, INFRA_HOSTS, FRONTEND_HOST, ALL_HOSTS = (
    "all nodes", "leader node", "infra hosts", "first infra host", "all hosts")


@dataclass(frozen=True)
class PortUse:
    port: int
    owner: str  # e.g. "cohort 1 master port" or "etcd client"
    field: str  # the variable that sets it
    where: str  # ALL_NODES, LEADER_NODE, INFRA_HOSTS, FRONTEND_HOST or ALL_HOSTS


def cohort_ports(ports: Ports, cohort: int) -> CohortPorts:
    return CohortPorts(
        master=ports.master_base + ports.master_stride * cohort,
        system=ports.system_base + cohort,
        nixl=ports.nixl_base + cohort,
    )


def port_uses(ports: Ports, cohorts: int, infra_hosts: int = 1) -> list[PortUse]:
    """Every port of the deployment with who uses it, infra first, then cohort by cohort. NATS's cluster routes
    exist with several infra hosts only (``infra_hosts``)."""
    uses = [
        PortUse(ports.frontend, "frontend", "gms_ports.frontend", FRONTEND_HOST),
        PortUse(ports.etcd_client, "etcd client", "gms_ports.etcd_client", INFRA_HOSTS),
        PortUse(ports.etcd_peer, "etcd peer", "gms_ports.etcd_peer", INFRA_HOSTS),
        PortUse(ports.nats, "NATS", "gms_ports.nats", INFRA_HOSTS),
        PortUse(ports.nats_monitor, "NATS monitoring", "gms_ports.nats_monitor", INFRA_HOSTS),
        *([PortUse(ports.nats_cluster, "NATS cluster routes", "gms_ports.nats_cluster", INFRA_HOSTS)]
          if infra_hosts > 1 else []),
        PortUse(ports.agent_metrics, "agent metrics", "gms_ports.agent_metrics", ALL_NODES),
        *(PortUse(ports.etcd_proxy + member, f"etcd proxy to member {member + 1} (loopback)", "gms_ports.etcd_proxy",
                  ALL_HOSTS) for member in range(max(ETCD_MEMBER_COUNTS))),  # a port for each possible member
    ]
    for cohort in range(cohorts):
        cp = cohort_ports(ports, cohort)
        uses += [
            PortUse(cp.master, f"cohort {cohort} master port", "gms_ports.master_base/master_stride", LEADER_NODE),
            PortUse(cp.system, f"cohort {cohort} system port", "gms_ports.system_base", ALL_NODES),
            PortUse(cp.nixl, f"cohort {cohort} NIXL side channel", "gms_ports.nixl_base", ALL_NODES),
        ]
    return uses


def host_port_uses(contract: Contract) -> dict[str, list[PortUse]]:
    """The ports each host of the deployment binds, in port_uses' order: the infra host that is also the leader
    node (the default) has both's. Every replica's leader node binds its cohorts' master ports (the same numbers
    in every replica, on different hosts). A spare (gms_spares) may take any rank of any replica, the leader's
    too: it has a node's and a leader node's ports."""
    spares = [n.host for n in contract.spares]
    nodes = [n.host for n in contract.nodes] + spares
    infra = [n.host for n in contract.infra_hosts]
    leaders = [members[0].host for members in contract.replicas] + spares
    hosts = {ALL_NODES: nodes, LEADER_NODE: leaders, INFRA_HOSTS: infra, FRONTEND_HOST: infra[:1],
             ALL_HOSTS: list(dict.fromkeys(nodes + infra))}
    by_host: dict[str, list[PortUse]] = {host: [] for host in hosts[ALL_HOSTS]}
    for use in port_uses(contract.ports, contract.cohorts, len(infra)):
        for host in hosts[use.where]:
            by_host[host].append(use)
    return by_host


def port_problems(contract: Contract) -> list[Problem]:
    """Ports outside 1024..65535, and two uses of one port on one host (each pair once, with the hosts it is
    on)."""
    problems: list[Problem] = []
    for use in port_uses(contract.ports, contract.cohorts, len(contract.infra_hosts)):
        if not 1024 <= use.port <= 65535:
            problems.append(Problem(use.field, f"gives the {use.owner} port {use.port}, outside 1024..65535.",
                                    f"lower {use.field} (or gms_cohorts) so every port stays in 1024..65535."))
    collisions: dict[tuple[int, str, str], tuple[PortUse, PortUse, list[str]]] = {}
    for host, uses in host_port_uses(contract).items():
        first_use: dict[int, PortUse] = {}
        for use in uses:
            if not 1024 <= use.port <= 65535:
                continue
            earlier = first_use.setdefault(use.port, use)
            if earlier is not use:
                collisions.setdefault((use.port, earlier.owner, use.owner), (earlier, use, []))[2].append(host)
    for (port, _unused, _unused2), (earlier, use, hosts) in collisions.items():
        fields = use.field if use.field == earlier.field else f"{use.field} or {earlier.field}"
        problems.append(Problem(use.field, f"port {port} is used by both the {earlier.owner} and the {use.owner} "
                                f"on {hosts_text(hosts)}.",
                                f"move {fields} so no two processes of a host share a port (each cohort takes "
                                "one master, one system and one NIXL port)."))
    return problems


def hosts_text(hosts: list[str]) -> str:
    """node0 / node0 and node1 / node0, node1 and node2 / node0, node1, node2 and 5 more."""
    if len(hosts) > 3:
        return f"{', '.join(hosts[:3])} and {len(hosts) - 3} more"
    return hosts[0] if len(hosts) == 1 else f"{', '.join(hosts[:-1])} and {hosts[-1]}"
