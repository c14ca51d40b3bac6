"""The plan builder: from a parsed Contract to the cohort plan (plan.py), every process with its argv and environment.

This is the only place that builds engine command lines and does port arithmetic (via ports.py); its callers
(preflight, shadowline.gms.cohort_plan and the CLI's plan, slurm/render and a Slurm job) hand the Plan on.
The real backend renders ``python -m dynamo.vllm``; the stand-in renders ``python -m
shadowline.standin.engine`` with exactly the same flags and environment: only the executable differs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ..backends import backend
from ..common.problems import Problem, format_problems
from ..common.settings import DEFAULT_ROUTER_MODE, CohortPorts, Node, Ports
from .contract import CONFIG_DIR, STATE_DIR, Contract
from .pki import subject_dn
from .plan import (
    CohortPlan,
    InfraPlan,
    Plan,
    Process,
    RankPlan,
    Security,
    gms_dir,
    model_view_dir,
    nats_store_dir,
    replica_view,
)
from .ports import cohort_ports, port_problems

FRONTEND_MIGRATION_LIMIT = 3
HAPROXY, PYTHON_PROXY = "haproxy", "python"  # what carries Dynamo's etcd client to TLS on a host (_etcd_proxy)
# etcd's auth tokens: signed JWTs (ES256, the deployment's key on every member), valid for a year. A parked shadow's
# Dynamo runtime authenticated when the shadow started and uses its token again only when it wakes, to register,
# and Dynamo's etcd client never authenticates again. etcd's default simple tokens live in one member's memory and
# die unused after 300 s (``--auth-token-ttl``) or with the member: measured on the testbed, a shadow parked 9.5
# min, and one parked 40 s across an etcd restart, each failed to wake (its worker's first etcd write refused,
# "The request does not have a valid authentication token"; the handover fell back to the old primary). A JWT
# survives both, is taken by every member, and ends only when its year does; it is only ever held by a process on
# a deployment host (over TLS, or its host's loopback proxy), made from that host's password file.
ETCD_TOKEN_TTL_S = 365 * 24 * 3600


def insecure_warning(deployment: str) -> str:
    """What every run of a deployment with gms_insecure: true says (preflight, slurm/render)."""
    return (f"gms_insecure is true: deployment {deployment} runs etcd without authentication and NATS without "
            "TLS. Anyone who can reach the infra hosts (a Slurm job's first node) can forge slot records (make "
            "every node kill any cohort; so can a failure notice to the agents from a node's address), fake "
            "discovery registrations and read all traffic. Remove gms_insecure "
            "to close the control plane (docs/security.md).")


def runtime_python(contract: Contract) -> str:
    """The interpreter that runs the GMS server, the engines and the frontend: the image's in container mode."""
    return contract.container.python if contract.container else contract.python


class PlanRefused(ValueError):
    """A contract whose plan cannot run: its ``problems`` name the variables and the fixes."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(format_problems(problems, "the cohort plan"))
        self.problems = problems


def plan_problems(contract: Contract) -> list[Problem]:
    """What makes a parsed contract's plan unrunnable: its ports, checked where they are bound (ports.py)."""
    return port_problems(contract)


def checked_plan(contract: Contract, **options: Any) -> tuple[Plan | None, list[Problem]]:
    """(the plan, []) or (None, the problems that refuse it): build_plan for callers that report problems."""
    try:
        return build_plan(contract, **options), []
    except PlanRefused as refused:
        return None, refused.problems


def build_plan(contract: Contract, state_dir: str | None = None, config_dir: str | None = None,
               model_view: bool = True, etcd_proxy: str = HAPROXY) -> Plan:
    """The plan of a contract. ``state_dir``/``config_dir`` default to the hosts' (/var/lib/shadowline/<dep>,
    /etc/shadowline/<dep>); a Slurm job passes node-local directories of its own, ``model_view`` False: its
    engines are no systemd units, so they name the model's directory itself (see Plan.model_view), and
    ``etcd_proxy`` PYTHON_PROXY: its nodes may have no HAProxy (slurm/etcd_proxy.py). Every path to a plan
    comes through here, so every one refuses the same contracts: PlanRefused (plan_problems; checked_plan
    returns them instead)."""
    problems = plan_problems(contract)
    if problems:
        raise PlanRefused(problems)
    dirs = _Dirs(state=state_dir or STATE_DIR.format(deployment=contract.deployment),
                 config=config_dir or CONFIG_DIR.format(deployment=contract.deployment))
    model_path = model_view_dir(dirs.state) if model_view else contract.model.local_dir
    security = Security(insecure=contract.insecure, dir=f"{dirs.config}/secrets", controller_dir=contract.secrets_dir,
                        firewall_allow=contract.firewall_allow, frontend_allow=contract.frontend_allow,
                        frontend_tls=contract.frontend_tls,  # Security.frontend_https: never when insecure
                        etcd_tls=not contract.insecure)
    infra = _infra_plan(contract, dirs, security, etcd_proxy)
    gms_servers = tuple(_gms_server(contract, node) for node in contract.nodes + contract.spares)
    by_replica = [tuple(_cohort_plan(contract, infra, security, cohort, model_path, members)
                        for cohort in range(contract.cohorts)) for members in contract.replicas]
    # a cohort of the deployment: every replica's ranks of it, replica by replica (Replica.cohorts: one's own)
    cohorts = tuple(replace(of_each[0], ranks=tuple(rank for own in of_each for rank in own.ranks))
                    for of_each in zip(*by_replica))
    replicas = tuple(replica_view(q, tuple(n.host for n in members), members[0].address, contract.ports.master_base,
                                  contract.lock_path, cohorts) for q, members in enumerate(contract.replicas))
    overridden = env_overridden(contract, cohorts)
    if overridden:
        raise PlanRefused(overridden)
    return Plan(
        deployment=contract.deployment, backend=contract.engine.backend,
        state_dir=dirs.state, config_dir=dirs.config, service_user=contract.service_user,
        gpus_per_node=contract.engine.gpus_per_node, ports=contract.ports,
        failover=contract.failover, model_id=contract.model.id,
        model_dir=contract.model.local_dir, revision=contract.model.revision, socket_dir=contract.socket_dir,
        lock_path=contract.lock_path, nodes=contract.nodes, infra=infra, gms_servers=gms_servers, cohorts=cohorts,
        python=contract.python, monitoring=contract.monitoring, security=security, container=contract.container,
        replicas=replicas, spares=contract.spares,
    )


def env_overridden(contract: Contract, cohorts: tuple[CohortPlan, ...]) -> list[Problem]:
    """gms_engine.env names that the plan sets itself for a rank (ENGINE_ID, FAILOVER_LOCK_PATH, ETCD_ENDPOINTS,
    the backend's CUDA_VISIBLE_DEVICES, ...): refused, the one list of such names being what the plan renders.
    Values are never named (they are the user's, and may be anything)."""
    names = {name for cohort in cohorts for rank in cohort.ranks for name, value in contract.engine.env
             if rank.process.env.get(name) != value}
    return [Problem(field=f"gms_engine.env.{name}", message="is set by shadowline itself for every rank (from the plan).",
                    fix="remove it from gms_engine.env; the variable it comes from is in docs/variables.md.")
            for name in sorted(names)]


@dataclass(frozen=True)
class _Dirs:
    state: str  # etcd data, NATS store, the frontend's HOME, event logs
    config: str  # NATS configuration, plan.json


def _infra_plan(contract: Contract, dirs: _Dirs, security: Security, etcd_proxy: str) -> InfraPlan:
    ports = contract.ports
    scheme = "https" if security.etcd_https else "http"
    etcd = ",".join(f"{scheme}://{n.address}:{ports.etcd_client}" for n in contract.infra_hosts)
    scheme = "nats" if security.insecure else "tls"  # Dynamo wants tls:// whenever NATS_TLS_* is set
    nats = ",".join(f"{scheme}://{n.address}:{ports.nats}" for n in contract.infra_hosts)
    first = contract.infra_hosts[0]
    argv = (runtime_python(contract), "-m", "dynamo.frontend", "--http-host", contract.frontend_bind,
            "--http-port", str(ports.frontend), "--migration-limit", str(FRONTEND_MIGRATION_LIMIT))
    if contract.frontend_router_mode != DEFAULT_ROUTER_MODE:  # Dynamo's default, left implicit (no unit changes)
        argv += ("--router-mode", contract.frontend_router_mode)
    env = {
        **_discovery_env(_dynamo_etcd(contract, security, etcd), nats, security, contract.deployment, first.host),
        "ETCD_LEASE_TTL": str(contract.engine.lease_ttl_s),  # the engines' etcd outage tolerance, the frontend's too
        "DYN_TCP_RESPONSE_STREAM_HOST": first.address,
        "HF_HUB_OFFLINE": "1",
        "HOME": f"{dirs.state}/frontend",
        "SHADOWLINE_DEPLOYMENT": contract.deployment,
        **frontend_https(security),
    }
    scheme = "https" if security.frontend_https else "http"
    return InfraPlan(hosts=contract.infra_hosts, etcd_endpoints=etcd, nats_server=nats,
                     frontend_url=f"{scheme}://{_reachable(contract.frontend_bind, first.address)}:{ports.frontend}",
                     frontend=Process(host=first.host, argv=argv, env=env),
                     etcd=tuple(_etcd_member(contract, dirs, security, node) for node in contract.infra_hosts),
                     nats=tuple(_nats_server(contract, dirs, security, node) for node in contract.infra_hosts),
                     etcd_proxies=tuple(_etcd_proxy(contract, dirs, security, host, etcd_proxy)
                                        for host in dict.fromkeys(n.host for n in contract.nodes + contract.spares
                                                                  + contract.infra_hosts))
                     if security.etcd_https else ())


def etcd_proxy_ports(ports: Ports, members: int) -> list[int]:
    """The etcd proxy's loopback ports, one per member in the members' order: ``gms_ports.etcd_proxy`` + index."""
    return [ports.etcd_proxy + index for index in range(members)]


def _dynamo_etcd(contract: Contract, security: Security, members: str) -> str:
    """The etcd endpoints of Dynamo's processes (one per member, in the members' order; _discovery_env picks
    one): the ``members`` themselves, or with etcd's client TLS, the host's etcd proxy on loopback, a port per
    member (etcd_proxy_ports)."""
    if not security.etcd_https:
        return members
    return ",".join(f"http://127.0.0.1:{port}" for port in etcd_proxy_ports(contract.ports, len(contract.infra_hosts)))


def _etcd_proxy(contract: Contract, dirs: _Dirs, security: Security, host: str, kind: str) -> Process:
    """The etcd proxy of one host: accepting plain connections on loopback only (a port per member) and carrying
    each to its member over TLS, presenting the host's client certificate and checking the member's against the
    deployment's CA and the member's host name. For Dynamo 1.6.1's engines and frontend, whose etcd client has no
    TLS (docs/security.md); the agent and the modules use TLS themselves. It offers ALPN ``h2``: etcd's Go server
    speaks gRPC over TLS only to a client that does (a plain TLS tunnel such as stunnel is answered with HTTP/1.1
    and Dynamo's client never connects, measured). etcd's passwords still apply: a local process without one reads
    and writes nothing. HAProxy in TCP mode as the service user (a host of a playbook deployment), or ``kind``
    PYTHON_PROXY: the job's own, from the runtime's Python (a Slurm job's node, slurm/etcd_proxy.py)."""
    members = contract.infra_hosts
    routes = [(port, member.host, _host_port(member.address, contract.ports.etcd_client))
              for port, member in zip(etcd_proxy_ports(contract.ports, len(members)), members)]
    if kind == PYTHON_PROXY:
        argv = [contract.python, "-m", "shadowline.slurm.etcd_proxy", "--ca", security.ca,
                "--cert", security.client_pem]
        for port, name, member in routes:
            argv += ["--route", f"{port}={name}@{member}"]
        return Process(host=host, argv=tuple(argv), env={})
    config_path = f"{dirs.config}/etcd-proxy.cfg"
    lines = [f"# shadowline {contract.deployment}: Dynamo's etcd client on loopback, TLS to each etcd member",
             "global", "    log stderr format raw daemon warning", "    maxconn 4096", "    nbthread 1",
             "defaults", "    mode tcp", "    log global", "    timeout connect 2s",
             # gRPC streams (watches, lease keep-alives) stay open for as long as the engine runs
             "    timeout client 1d", "    timeout server 1d"]
    for index, (port, name, member) in enumerate(routes):
        lines += [f"listen etcd-{index}", f"    bind 127.0.0.1:{port}",
                  f"    server member-{index} {member} ssl "
                  f"verify required ca-file {security.ca} crt {security.client_pem} alpn h2 verifyhost {name}"]
    return Process(host=host, argv=(contract.binaries.haproxy, "-db", "-f", config_path), env={},
                   files={config_path: "\n".join(lines) + "\n"})


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def frontend_https(security: Security) -> dict[str, str]:
    """gms_frontend_tls: the OpenAI API over HTTPS with the frontend host's server certificate, and with ``mutual``
    a client certificate of the deployment's CA required (Dynamo 1.6.1's dynamo/frontend/frontend_args.py:
    ``--tls-cert-path``, ``--tls-key-path``, ``--tls-client-ca-cert-path``, read from these variables)."""
    if not security.frontend_https:
        return {}
    env = {"DYN_TLS_CERT_PATH": security.server_cert, "DYN_TLS_KEY_PATH": security.server_key}
    if security.frontend_mutual:
        env["DYN_TLS_CLIENT_CA_CERT_PATH"] = security.ca
    return env


def _reachable(bind: str, address: str) -> str:
    """Where clients reach a server bound to ``bind`` on the node with ``address`` (a wildcard is not an address)."""
    if bind in ("0.0.0.0", "::", "[::]"):
        return address
    return f"[{bind}]" if ":" in bind and not bind.startswith("[") else bind


def _etcd_member(contract: Contract, dirs: _Dirs, security: Security, node: Node) -> Process:
    """One etcd member, listening on the node's address only; 1 or 3 members form the cluster. Unless insecure,
    the members talk to each other over TLS with certificates of the deployment's CA (peer TLS, client
    certificates required): the cluster's own traffic is encrypted and no host off the deployment can join it.
    With ``etcd_tls`` its clients too: HTTPS and gRPC over TLS, a client certificate of the deployment's CA
    required (Dynamo's processes through their host's etcd proxy)."""
    ports = contract.ports
    peer = "http" if security.insecure else "https"
    client = "https" if security.etcd_https else "http"
    cluster = ",".join(f"{n.host}={peer}://{n.address}:{ports.etcd_peer}" for n in contract.infra_hosts)
    argv = (contract.binaries.etcd, "--name", node.host,
            "--data-dir", f"{dirs.state}/etcd",
            "--listen-client-urls", f"{client}://{node.address}:{ports.etcd_client}",
            "--advertise-client-urls", f"{client}://{node.address}:{ports.etcd_client}",
            "--listen-peer-urls", f"{peer}://{node.address}:{ports.etcd_peer}",
            "--initial-advertise-peer-urls", f"{peer}://{node.address}:{ports.etcd_peer}",
            "--initial-cluster", cluster, "--initial-cluster-token", f"shadowline-{contract.deployment}",
            "--initial-cluster-state", "new",
            # keep one hour of history: a watcher's revision older than that is compacted (the agents' watch
            # then reads the view again, control/feed.py); without it the history grows until etcd's quota
            "--auto-compaction-mode", "periodic", "--auto-compaction-retention", "1h")
    if not security.insecure:  # role-based access (cluster/access.py): the tokens it hands out are JWTs
        argv += ("--auth-token", f"jwt,pub-key={security.etcd_jwt_pub},priv-key={security.etcd_jwt_key},"
                                 f"sign-method=ES256,ttl={ETCD_TOKEN_TTL_S}s")
        argv += ("--peer-cert-file", security.server_cert, "--peer-key-file", security.server_key,
                 "--peer-trusted-ca-file", security.ca, "--peer-client-cert-auth")
    if security.etcd_https:
        argv += ("--cert-file", security.server_cert, "--key-file", security.server_key,
                 "--trusted-ca-file", security.ca, "--client-cert-auth")
    return Process(host=node.host, argv=argv, env={})


def _nats_server(contract: Contract, dirs: _Dirs, security: Security, node: Node) -> Process:
    """NATS with JetStream; client port on the node's address, monitoring on loopback only; unless insecure, TLS
    with a certificate of the deployment's CA required of every client and route, and each client certificate
    mapped to its host's NATS user with Dynamo's subjects only (``nats_authorization``)."""
    ports = contract.ports
    config_path = f"{dirs.config}/nats-server.conf"
    tls = ("" if security.insecure else
           f'tls {{ cert_file: "{security.server_cert}", key_file: "{security.server_key}", '
           f'ca_file: "{security.ca}", verify: true, timeout: 2 }}')
    lines = [
        f'server_name: "{node.host}"',
        f'listen: "{node.address}:{ports.nats}"',
        f'http: "127.0.0.1:{ports.nats_monitor}"',
        f'jetstream {{ store_dir: "{nats_store_dir(dirs.state)}" }}',
    ]
    if not security.insecure:
        lines += [tls.replace("verify: true", "verify_and_map: true"), *nats_authorization(contract)]
    if len(contract.infra_hosts) > 1:
        routes = ", ".join(f'"nats-route://{n.address}:{ports.nats_cluster}"' for n in contract.infra_hosts)
        lines.append(f'cluster {{ name: "shadowline-{contract.deployment}", '
                     f'listen: "{node.address}:{ports.nats_cluster}", routes: [{routes}]' + (f", {tls}" if tls else "") + " }")
    return Process(host=node.host, argv=(contract.binaries.nats_server, "-c", config_path), env={},
                   files={config_path: "\n".join(lines) + "\n"})


DYNAMO_NAMESPACE = "dynamo"  # Dynamo 1.6.1's own: its engines serve dyn://dynamo.backend.generate unless told


def dynamo_namespace(engine_args: tuple[str, ...]) -> str:
    """The Dynamo namespace the engines register in: the one their ``--endpoint dyn://<namespace>.<component>.
    <endpoint>`` names (in gms_engine.extra_args), else Dynamo's default."""
    for i, arg in enumerate(engine_args):
        value = (engine_args[i + 1] if arg == "--endpoint" and i + 1 < len(engine_args) else
                 arg.split("=", 1)[1] if arg.startswith("--endpoint=") else None)
        if value:
            return value.split("://")[-1].split(".")[0] or DYNAMO_NAMESPACE
    return DYNAMO_NAMESPACE


def nats_subjects(namespace: str) -> dict[str, tuple[str, ...]]:
    """What a Dynamo process (engine, frontend) may publish and subscribe to: its namespace's subjects (events and
    metrics: ``namespace.<ns>.component.<c>.endpoint.<e>.<event>``), replies to its requests (``_INBOX``), and
    JetStream's API, acknowledgements, flow control, key-value and object stores (``$JS``, ``$KV``, ``$O``, the
    prefixes Dynamo's runtime library names). Nothing else: not another namespace, not the system account."""
    events = f"namespace.{namespace}.>"
    return {"publish": (events, "_INBOX.>", "$JS.API.>", "$JS.ACK.>", "$JS.FC.>", "$KV.>", "$O.>"),
            "subscribe": (events, "_INBOX.>")}


def nats_authorization(contract: Contract) -> list[str]:
    """NATS's users, one per host of the deployment, each named by its client certificate's subject (TLS
    ``verify_and_map``) and allowed Dynamo's subjects only. The controller's certificate (status, drills) maps to
    no user: NATS refuses it, as it refuses any certificate of another CA."""
    subjects = nats_subjects(dynamo_namespace(contract.engine.extra_args))
    allowed = ", ".join(f'{kind}: {{ allow: [{", ".join(json.dumps(s) for s in names)}] }}'
                        for kind, names in subjects.items())
    hosts = dict.fromkeys(n.host for n in contract.nodes + contract.spares + contract.infra_hosts)
    users = ", ".join(f"{{ user: {json.dumps(subject_dn(contract.deployment, host))}, permissions: $DYNAMO }}"
                      for host in hosts)
    return [f"authorization {{ DYNAMO = {{ {allowed} }}, users = [ {users} ] }}"]


def _discovery_env(etcd_endpoints: str, nats_server: str, security: Security, deployment: str, host: str,
                   seed: int = 0) -> dict[str, str]:
    """How every Dynamo client (frontend, engines, Slurm steps) reaches etcd and NATS: one member of each and,
    unless insecure, the paths of NATS's TLS files and the NATS user the client on ``host`` is (its certificate's
    subject, nats_identity). etcd's password is no part of it: the units read it from ``security.dynamo_env``
    (ETCD_AUTH_USERNAME/PASSWORD), so it is never in a unit file or the plan.

    One member, not the list (``seed``: the frontend 0, a cohort its number, spread over the members), because
    of what Dynamo 1.6.1 does with a list (measured on the 3-infra testbed): NATS_SERVER with several servers,
    TLS or not, never connects ("Failed to connect to NATS"); ETCD_ENDPOINTS with several members sends a share
    of its calls to a member that is down and fails them ("tcp connect error"), so an engine starting while one
    member is stopped exits before it registers. With one member each, a stopped member takes down only the
    cohorts that use it, and a parked shadow on another member takes over (docs/reliability.md). The agents'
    own client uses every member (common/etcd_client.py)."""
    servers, members = nats_server.split(","), etcd_endpoints.split(",")
    env = {"ETCD_ENDPOINTS": members[seed % len(members)], "NATS_SERVER": servers[seed % len(servers)]}
    if not security.insecure:
        env.update(NATS_TLS_CA_CERT_PATH=security.ca, NATS_TLS_CLIENT_CERT_PATH=security.client_cert,
                   NATS_TLS_CLIENT_KEY_PATH=security.client_key, **nats_identity(deployment, host),
                   **request_plane_tls(security))
    return env


def nats_identity(deployment: str, host: str) -> dict[str, str]:
    """What a Dynamo client on ``host`` tells NATS: the NATS user its certificate maps to (nats_authorization) and
    no password. The certificate is the credential: nats-server 2.9 takes the user from it, logs the name sent
    in CONNECT (``User ... found in connect proto, but user required from cert``, a warning) and refuses a
    password, since the mapped user has none. Without these variables Dynamo 1.6.1 connects as user ``user``
    with password ``user`` and is refused (measured)."""
    return {"NATS_AUTH_USERNAME": subject_dn(deployment, host), "NATS_AUTH_PASSWORD": ""}


# How long Dynamo's request-plane client keeps a worker's connections after the last request to it. Dynamo
# 1.6.1's client over TLS never closes a connection whose worker died (it stays in CLOSE-WAIT) and its tokio
# runtime then spins: the frontend used 1.1-1.6 CPU cores after each failover on the testbed (10,000
# epoll_wait calls a second, each returning nothing), until the connection's host pool is dropped as idle:
# after 300 s by default. Plain TCP closes the connection at once (0.8 % CPU). With 3 s the spin ended 8-30 s
# after each failover (1 s ended it no sooner), and 0 connections stayed in CLOSE-WAIT (docs/security.md).
# A worker idle longer than this gets a new connection (one TLS handshake) with its next request.
REQUEST_PLANE_IDLE_TTL_S = 3


def request_plane_tls(security: Security) -> dict[str, str]:
    """Dynamo's TCP request plane (requests from the frontend to a worker, responses streamed back) with mutual
    TLS: each process serves with its host's server certificate, presents its client certificate, and trusts
    only the deployment's CA both ways (the names of Dynamo 1.6.1's dynamo/frontend/frontend_args.py and
    dynamo/common/configuration/groups/runtime_args.py); and the client drops a worker's connections once
    idle for REQUEST_PLANE_IDLE_TTL_S (``DYN_TCP_HOST_IDLE_TTL_SECS``, read by its
    pipeline/network/egress/tcp_client.rs), which ends them after the worker died."""
    return {"DYN_TCP_TLS_CERT_PATH": security.server_cert, "DYN_TCP_TLS_KEY_PATH": security.server_key,
            "DYN_TCP_TLS_CA_CERT_PATH": security.ca, "DYN_TCP_TLS_CLIENT_CA_CERT_PATH": security.ca,
            "DYN_TCP_TLS_CLIENT_CERT_PATH": security.client_cert,
            "DYN_TCP_TLS_CLIENT_KEY_PATH": security.client_key,
            "DYN_TCP_HOST_IDLE_TTL_SECS": str(REQUEST_PLANE_IDLE_TTL_S)}


def _gms_server(contract: Contract, node: Node) -> Process:
    argv = (runtime_python(contract), "-m", backend(contract.engine.backend).gms_module)
    env = {"GMS_SOCKET_DIR": gms_dir(contract.socket_dir, contract.model.revision),
           "SHADOWLINE_DEPLOYMENT": contract.deployment}
    env.update(_backend_env(contract, node))
    return Process(host=node.host, argv=argv, env=env)


def _backend_env(contract: Contract, node: Node) -> dict[str, str]:
    return backend(contract.engine.backend).node_env(contract.deployment, node.host, contract.engine.gpus_per_node)


def _cohort_plan(contract: Contract, infra: InfraPlan, security: Security, cohort: int,  # noqa: PLR0913 (one cohort's inputs)
                 model_path: str, members: tuple[Node, ...]) -> CohortPlan:
    """One replica's ranks of a cohort (``members``: its nodes in rank order; the master address its leader's)."""
    ports = cohort_ports(contract.ports, cohort)
    ranks = tuple(_rank_plan(contract, infra, security, cohort, ports, node, model_path, members[0].address)
                  for node in members)
    return CohortPlan(cohort=cohort, engine_id=cohort, role="primary" if cohort == 0 else "shadow",
                      ports=ports, ranks=ranks)


def _rank_plan(contract: Contract, infra: InfraPlan, security: Security, cohort: int, ports: CohortPorts,  # noqa: PLR0913 (one rank's inputs)
               node: Node, model_path: str, master_address: str) -> RankPlan:
    engine = contract.engine
    headless = node.rank != 0
    argv = [runtime_python(contract), "-m", backend(engine.backend).engine_module,
            "--model", model_path, "--served-model-name", contract.model.id,
            "--load-format", "gms", *(() if engine.cuda_graphs else ("--enforce-eager",)), "--enable-sleep-mode",
            "--tensor-parallel-size", str(engine.tensor_parallel_size)]
    if engine.nnodes > 1:
        argv += ["--distributed-executor-backend", "mp", "--nnodes", str(engine.nnodes),
                 "--node-rank", str(node.rank), "--master-addr", master_address,
                 "--master-port", str(ports.master)]
    argv += backend(engine.backend).watchdog_args(contract.failover.collective_timeout_s)
    if headless:
        argv.append("--headless")
    argv += list(engine.extra_args)
    env = {
        **dict(engine.env),  # gms_engine.env: what the plan sets below wins, and build_plan refuses such a name
        "ENGINE_ID": str(cohort),
        "DYN_VLLM_GMS_SHADOW_MODE": "true",
        "FAILOVER_LOCK_PATH": contract.lock_path,
        "GMS_SOCKET_DIR": gms_dir(contract.socket_dir, contract.model.revision),
        **_discovery_env(_dynamo_etcd(contract, security, infra.etcd_endpoints), infra.nats_server, security,
                         contract.deployment, node.host, seed=cohort),
        "ETCD_LEASE_TTL": str(engine.lease_ttl_s),
        "DYN_SYSTEM_PORT": str(ports.system),
        "DYN_SYSTEM_HOST": node.address,
        "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS": '["generate"]',
        "DYN_TCP_RPC_HOST": node.address,
        "DYN_EVENT_PLANE": "nats",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(ports.nixl),
        "VLLM_NIXL_SIDE_CHANNEL_HOST": node.address,
        "HF_HUB_OFFLINE": "1",
        "SHADOWLINE_DEPLOYMENT": contract.deployment,
        "SHADOWLINE_COHORT": str(cohort),
        "SHADOWLINE_NODE_RANK": str(node.rank),
    }
    env.update(_backend_env(contract, node))
    env.update(backend(engine.backend).watchdog_env(contract.failover.collective_timeout_s))
    return RankPlan(host=node.host, address=node.address, node_rank=node.rank, leader=not headless,
                    headless=headless, process=Process(host=node.host, argv=tuple(argv), env=env))
