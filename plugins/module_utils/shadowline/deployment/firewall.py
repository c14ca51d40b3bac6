"""The deployment's host firewall (nftables), rendered from the plan (issue #13).

Dynamo 1.6.1 serves its engines' control endpoints (the system port's ``/engine/...``: sleep, wake, weight
reload) without authentication, and the torch master port and the NIXL side channel accept anyone; the node
agent's metrics port and etcd's and NATS's ports are open too. Each host gets one nftables table owned by the
deployment (``inet shadowline_<deployment>``) that drops a connection to those ports from any address that is not
one of the deployment's nodes, infra hosts, its monitoring host, loopback, or ``gms_firewall_allow``. The frontend's
port is open to anyone, or, with ``gms_frontend_allow``, to those sources and the deployment's own. A oneshot
unit (``shadowline-<deployment>-firewall.service``) loads the table at boot and deletes it when stopped, so
teardown removes it with the other units.
"""

from __future__ import annotations

import ipaddress

from .plan import Plan, gpu_hosts

NFT = "/usr/sbin/nft"


def table_name(plan: Plan) -> str:
    return "shadowline_" + plan.deployment.replace("-", "_")


def rules_path(plan: Plan) -> str:
    return f"{plan.config_dir}/firewall.nft"


def protected_ports(plan: Plan, host: str) -> list[int]:
    """The ports on ``host`` that only the deployment may reach."""
    ports: set[int] = set()
    if host in gpu_hosts(plan):  # a spare: the ports of the rank it may take
        for cohort in plan.cohorts:
            ports |= {cohort.ports.system, cohort.ports.nixl, cohort.ports.master}
        ports.add(plan.ports.agent_metrics)
    if host in plan.infra_hosts:
        ports |= {plan.ports.etcd_client, plan.ports.etcd_peer, plan.ports.nats, plan.ports.nats_cluster}
    return sorted(ports)


def allowed_addresses(plan: Plan, extra: tuple[str, ...] | None = None) -> tuple[list[str], list[str]]:
    """(IPv4, IPv6) sources allowed to reach the protected ports: the deployment's hosts, monitoring, loopback and
    ``extra`` (default: gms_firewall_allow)."""
    addresses = [n.address for n in plan.nodes + plan.spares] + [n.address for n in plan.infra.hosts]
    if plan.monitoring is not None:
        addresses.append(plan.monitoring.address)
    v4, v6 = ["127.0.0.0/8"], ["::1"]
    if extra is None:
        extra = plan.security.firewall_allow if plan.security else ()
    addresses += list(extra)
    for address in dict.fromkeys(addresses):
        try:
            ip = ipaddress.ip_network(address, strict=False)
        except ValueError:
            v4.append(address)  # a host name: nft resolves it when it loads the table
            continue
        text = str(ip.network_address) if ip.num_addresses == 1 else str(ip)
        (v4 if ip.version == 4 else v6).append(text)
    return v4, v6


def firewall_rules(plan: Plan, host: str) -> str:
    """The nft script for ``host``: replaces the deployment's table atomically (one transaction)."""
    table = table_name(plan)
    ports = ", ".join(str(p) for p in protected_ports(plan, host))
    v4, v6 = allowed_addresses(plan)
    lines = [
        f"# shadowline {plan.deployment}: only the deployment's hosts reach its engines', agents' and infra ports",
        f"table inet {table} {{}}",
        f"delete table inet {table}",
        f"table inet {table} {{",
        f"  set allowed4 {{ type ipv4_addr; flags interval; elements = {{ {', '.join(v4)} }} }}",
        f"  set allowed6 {{ type ipv6_addr; flags interval; elements = {{ {', '.join(v6)} }} }}",
        f"  set protected {{ type inet_service; elements = {{ {ports} }} }}",
        "  chain input {",
        "    type filter hook input priority filter; policy accept;",
        "    iif lo accept",
        "    tcp dport @protected ip saddr @allowed4 accept",
        "    tcp dport @protected ip6 saddr @allowed6 accept",
        "    tcp dport @protected drop",
        *frontend_rules(plan, host),
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def frontend_rules(plan: Plan, host: str) -> list[str]:
    """With gms_frontend_allow, on the frontend's host: its port only for those sources and the deployment's."""
    allow = plan.security.frontend_allow if plan.security else ()
    if not allow or host != plan.infra.frontend.host:
        return []
    v4, v6 = allowed_addresses(plan, allow)
    port = plan.ports.frontend
    return [f"    tcp dport {port} ip saddr {{ {', '.join(v4)} }} accept",
            f"    tcp dport {port} ip6 saddr {{ {', '.join(v6)} }} accept",
            f"    tcp dport {port} drop"]


def firewall_unit(plan: Plan, host: str) -> str:
    """A oneshot that loads the table (at boot too) and deletes it when stopped (teardown)."""
    return "\n".join([
        "[Unit]",
        f"Description=shadowline {plan.deployment}: host firewall of the deployment's ports (nftables)",
        "Before=network-pre.target",
        "Wants=network-pre.target",
        "",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
        f"ExecStart={NFT} -f {rules_path(plan)}",
        f"ExecReload={NFT} -f {rules_path(plan)}",
        f"ExecStop=-{NFT} delete table inet {table_name(plan)}",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=CAP_NET_ADMIN",
        "RestrictAddressFamilies=AF_NETLINK AF_UNIX",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])
