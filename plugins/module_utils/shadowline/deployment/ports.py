"""Every port a deployment uses, computed in one place.

Cohort ports follow the upstream recipe: master port ``master_base + master_stride * cohort``, system
port ``system_base + cohort``, NIXL side channel ``nixl_base + cohort``. Infra ports (etcd, NATS,
frontend) are fixed per deployment.
"""

from __future__ import annotations

from dataclasses import dataclass

from .contract import ETCD_MEMBER_COUNTS, Ports
from .problems import Problem


@dataclass(frozen=True)
class CohortPorts:
    master: int
    system: int
    nixl: int


@dataclass(frozen=True)
class PortUse:
    port: int
    owner: str  # e.g. "cohort 1 master port" or "etcd client"
    field: str  # the variable that sets it
    where: str  # "all nodes", "leader node" or "infra hosts"


def cohort_ports(ports: Ports, cohort: int) -> CohortPorts:
    return CohortPorts(
        master=ports.master_base + ports.master_stride * cohort,
        system=ports.system_base + cohort,
        nixl=ports.nixl_base + cohort,
    )


def port_uses(ports: Ports, cohorts: int) -> list[PortUse]:
    """Every port of the deployment with who uses it, infra first, then cohort by cohort."""
    uses = [
        PortUse(ports.frontend, "frontend", "gms_ports.frontend", "infra hosts"),
        PortUse(ports.etcd_client, "etcd client", "gms_ports.etcd_client", "infra hosts"),
        PortUse(ports.etcd_peer, "etcd peer", "gms_ports.etcd_peer", "infra hosts"),
        PortUse(ports.nats, "NATS", "gms_ports.nats", "infra hosts"),
        PortUse(ports.nats_monitor, "NATS monitoring", "gms_ports.nats_monitor", "infra hosts"),
        PortUse(ports.nats_cluster, "NATS cluster routes", "gms_ports.nats_cluster", "infra hosts"),
        PortUse(ports.agent_metrics, "agent metrics", "gms_ports.agent_metrics", "all nodes"),
        *(PortUse(ports.etcd_proxy + member, f"etcd proxy to member {member + 1} (loopback)", "gms_ports.etcd_proxy",
                  "all hosts") for member in range(max(ETCD_MEMBER_COUNTS))),  # a port for each possible member
    ]
    for cohort in range(cohorts):
        cp = cohort_ports(ports, cohort)
        uses += [
            PortUse(cp.master, f"cohort {cohort} master port", "gms_ports.master_base/master_stride", "leader node"),
            PortUse(cp.system, f"cohort {cohort} system port", "gms_ports.system_base", "all nodes"),
            PortUse(cp.nixl, f"cohort {cohort} NIXL side channel", "gms_ports.nixl_base", "all nodes"),
        ]
    return uses


def port_problems(ports: Ports, cohorts: int) -> list[Problem]:
    """Collisions between any two uses, and ports outside 1024..65535."""
    problems: list[Problem] = []
    first_use: dict[int, PortUse] = {}
    for use in port_uses(ports, cohorts):
        if not 1024 <= use.port <= 65535:
            problems.append(Problem(use.field, f"gives the {use.owner} port {use.port}, outside 1024..65535.",
                                    f"lower {use.field} (or gms_cohorts) so every port stays in 1024..65535."))
            continue
        earlier = first_use.get(use.port)
        if earlier is None:
            first_use[use.port] = use
            continue
        problems.append(Problem(use.field, f"port {use.port} is used by both the {earlier.owner} and the {use.owner}.",
                                f"move {use.field} or {earlier.field} so the ranges do not overlap "
                                f"(each cohort takes one master, one system and one NIXL port)."))
    return problems
