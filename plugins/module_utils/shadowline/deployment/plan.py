"""The cohort plan: from a parsed Contract to every process of a deployment, with its argv and environment.

This is the only place that builds engine command lines and does port arithmetic (via ports.py). Roles,
Slurm templates, Ansible modules, the node agent and the stand-in all consume a Plan (or its dict form).
The real backend renders ``python -m dynamo.vllm``; the stand-in renders ``python -m
shadowline.standin.engine`` with exactly the same flags and environment: only the executable differs.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..backends import Backend, backend
from .container import Container
from .contract import (
    CONFIG_DIR,
    FRONTEND_TLS_MUTUAL,
    FRONTEND_TLS_PLAIN,
    STATE_DIR,
    Contract,
    Failover,
    Monitoring,
    Node,
    Ports,
)
from .pki import subject_dn
from .ports import CohortPorts, cohort_ports, port_problems
from .problems import Problem, format_problems

FRONTEND_MIGRATION_LIMIT = 3
HAPROXY, PYTHON_PROXY = "haproxy", "python"  # what carries Dynamo's etcd client to TLS on a host (_etcd_proxy)


@dataclass(frozen=True)
class Process:
    """One process to run on one host: what the systemd unit, the Slurm step or the agent starts."""
    host: str
    argv: tuple[str, ...]
    env: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)  # configuration files the process reads: path -> text

    def command_line(self) -> str:
        return " ".join(shell_quote(a) for a in self.argv)


@dataclass(frozen=True)
class RankPlan:
    host: str
    address: str
    node_rank: int
    leader: bool  # runs the Dynamo runtime and takes the failover lock
    headless: bool
    process: Process


@dataclass(frozen=True)
class CohortPlan:
    cohort: int
    engine_id: int
    role: str  # "primary" (writer: loads weights from disk) or "shadow" (imports them from GMS)
    ports: CohortPorts
    ranks: tuple[RankPlan, ...]

    def rank_on(self, host: str) -> RankPlan:
        return next(r for r in self.ranks if r.host == host)

    @property
    def leader(self) -> RankPlan:
        """Rank 0: runs the Dynamo runtime, serves /health and /metrics, takes the failover lock."""
        return next(r for r in self.ranks if r.leader)

    @property
    def system_url(self) -> str:
        """The leader's system server (/health, /metrics, the failover state)."""
        return f"http://{self.leader.address}:{self.ports.system}"

    @property
    def holder(self) -> str:
        """What this cohort's leader writes into the failover lock file when it holds the lock."""
        return f"engine-{self.engine_id}"


@dataclass(frozen=True)
class Security:
    """How the deployment's control plane is closed (docs/security.md); the paths are on every host.

    etcd: role-based access with a password per identity (agents: the deployment's coordination keys and
    Dynamo's discovery keys; Dynamo's engines and frontend: the discovery keys only), and with ``etcd_tls`` client
    TLS with certificates of the deployment's CA required. Dynamo 1.6.1's etcd client has no TLS (an https://
    endpoint fails with HttpsUriWithoutTlsSupport): its processes reach etcd through a TLS proxy on their host's
    loopback (``etcd_proxy``: HAProxy, or on a Slurm job's nodes the job's own, slurm/etcd_proxy.py).
    NATS: TLS with client certificates of the deployment's CA, required of every client; each host's certificate
    is a NATS user allowed Dynamo's subjects only (nats_authorization).
    ``insecure`` (gms_insecure: true): neither; every run warns. No secret is in the plan: only file paths.
    """
    insecure: bool
    dir: str  # on every host: <config_dir>/secrets (root:<service user> 0750)
    controller_dir: str  # gms_secrets_dir on the controller: the CA, every certificate and password
    firewall_allow: tuple[str, ...] = ()  # gms_firewall_allow: sources the host firewall lets in besides the hosts
    frontend_allow: tuple[str, ...] = ()  # gms_frontend_allow: who may reach the frontend's port (empty: anyone)
    frontend_tls: str = FRONTEND_TLS_PLAIN  # gms_frontend_tls: plain, tls, mutual
    etcd_tls: bool = False  # etcd's clients over TLS (every secure plan build_plan makes; False in plans of older collections)

    @property
    def etcd_https(self) -> bool:
        return not self.insecure and self.etcd_tls

    @property
    def frontend_https(self) -> bool:
        return not self.insecure and self.frontend_tls != FRONTEND_TLS_PLAIN

    @property
    def frontend_mutual(self) -> bool:
        return self.frontend_https and self.frontend_tls == FRONTEND_TLS_MUTUAL

    @property
    def controller_path(self) -> str:
        """``controller_dir`` as an absolute path on the controller (``~`` expanded)."""
        return os.path.abspath(os.path.expanduser(self.controller_dir))

    @property
    def ca(self) -> str:
        return f"{self.dir}/ca.crt"

    @property
    def client_cert(self) -> str:
        return f"{self.dir}/client.crt"

    @property
    def client_key(self) -> str:
        return f"{self.dir}/client.key"

    @property
    def server_cert(self) -> str:
        return f"{self.dir}/server.crt"

    @property
    def server_key(self) -> str:
        return f"{self.dir}/server.key"

    @property
    def etcd_client_cert(self) -> str:
        """The certificate the host's own etcd clients (the agent, the modules) present: one without a common name,
        since etcd 3.4's JSON gateway refuses a client certificate with one while authentication is on
        (``CommonName of client sending a request against gateway will be ignored``)."""
        return f"{self.dir}/etcd-client.crt"

    @property
    def etcd_client_key(self) -> str:
        return f"{self.dir}/etcd-client.key"

    @property
    def client_pem(self) -> str:
        """The host's client certificate and key in one file, as HAProxy (the etcd proxy) reads them."""
        return f"{self.dir}/client.pem"

    @property
    def dynamo_env(self) -> str:
        """EnvironmentFile of the engines and the frontend: ETCD_AUTH_USERNAME/PASSWORD (root 0600; systemd reads it)."""
        return f"{self.dir}/dynamo.env"

    def password_file(self, user: str) -> str:
        """The password of etcd user ``user`` (root, agent) on a host (root 0600)."""
        return f"{self.dir}/etcd-{user}.password"


def insecure_warning(deployment: str) -> str:
    """What every run of a deployment with gms_insecure: true says (preflight, slurm/render)."""
    return (f"gms_insecure is true: deployment {deployment} runs etcd without authentication and NATS without "
            "TLS. Anyone who can reach the infra hosts (a Slurm job's first node) can forge slot records (make "
            "every node kill any cohort; so can a failure notice to the agents from a node's address), fake "
            "discovery registrations and read all traffic. Remove gms_insecure "
            "to close the control plane (docs/security.md).")


ETCD_USERS = ("root", "agent", "dynamo")  # the deployment's etcd identities (control/access.py grants them)


@dataclass(frozen=True)
class InfraPlan:
    hosts: tuple[Node, ...]
    etcd_endpoints: str
    nats_server: str
    frontend_url: str
    frontend: Process
    etcd: tuple[Process, ...]  # one member per infra host
    nats: tuple[Process, ...]  # one server per infra host (a JetStream cluster with 3)
    etcd_proxies: tuple[Process, ...] = ()  # one per host of the deployment when etcd's clients use TLS


@dataclass(frozen=True)
class Plan:
    deployment: str
    backend: str
    state_dir: str
    config_dir: str
    service_user: str
    gpus_per_node: int
    ports: Ports
    failover: Failover
    model_id: str
    model_dir: str
    revision: str
    socket_dir: str
    lock_path: str
    nodes: tuple[Node, ...]
    infra: InfraPlan
    gms_servers: tuple[Process, ...]  # one per node, in rank order
    cohorts: tuple[CohortPlan, ...]
    python: str  # the runtime's interpreter on every node (engines, GMS server, frontend, agent)
    extra: dict[str, Any] = field(default_factory=dict)  # keys a newer plan carries that this code does not know
    monitoring: Monitoring | None = None  # gms_monitoring: Prometheus's host and settings (deployment/monitoring.py)
    security: Security | None = None  # None: a plan from before security (or a Slurm job's): plain, like insecure
    # python_env_mode container: the GMS server, engines and frontend run in this image (deployment/container.py);
    # their argv starts with the image's interpreter, and ``python`` is the host's (the agent, drills, tools)
    container: Container | None = None

    @property
    def secure(self) -> bool:
        """Whether etcd wants credentials and NATS TLS (the default; gms_insecure: true turns both off)."""
        return self.security is not None and not self.security.insecure

    @property
    def etcd_tls(self) -> bool:
        """Whether etcd's clients connect over TLS with a certificate of the deployment's CA (every secure plan
        but a Slurm job's)."""
        return self.security is not None and self.security.etcd_https

    # --- the one boundary: data for Ansible (the gms_plan fact, plan.json) and back ---------------------------
    def to_dict(self) -> dict[str, Any]:
        data = json.loads(json.dumps(asdict(self)))
        data.pop("extra", None)
        data.update(self.extra)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """The typed plan from its dict form (the `gms_plan` fact, plan.json, the spec of a Slurm script)."""
        if isinstance(data, Plan):
            return data
        return _plan_from_dict(data)

    @classmethod
    def load(cls, path: str) -> Plan:
        with open(path, encoding="utf-8") as handle:
            return cls.from_dict(json.load(handle))

    # --- the lookups every consumer needs -------------------------------------------------------------------
    def cohort(self, cohort: int) -> CohortPlan:
        return self.cohorts[cohort]

    @property
    def engine(self) -> Backend:
        """The backend's strategy: modules, environment, progress signals."""
        return backend(self.backend)

    def has_cohort(self, cohort: object) -> bool:
        return isinstance(cohort, int) and not isinstance(cohort, bool) and 0 <= cohort < len(self.cohorts)

    @property
    def cohort_ids(self) -> list[int]:
        return [c.cohort for c in self.cohorts]

    @property
    def leader_node(self) -> Node:
        """Node rank 0: every cohort's leader, the failover lock and the agents' driver live there."""
        return self.nodes[0]

    @property
    def hosts(self) -> list[str]:
        return [n.host for n in self.nodes]

    @property
    def infra_hosts(self) -> list[str]:
        """The hosts of etcd, NATS and the frontend (gms_infra, else the leader node)."""
        return [n.host for n in self.infra.hosts]

    def node(self, host: str) -> Node:
        for node in self.nodes:
            if node.host == host:
                return node
        raise KeyError(f"{host} is not a node of deployment {self.deployment} (nodes: {', '.join(self.hosts)})")

    def gms_server_on(self, host: str) -> Process:
        return on_host(self.gms_servers, host)

    @property
    def events_path(self) -> str:
        """The node's structured event log (agent, Slurm supervisor)."""
        return f"{self.state_dir}/events.jsonl"

    @property
    def engines_dir(self) -> str:
        """Each cohort's HOME lives below it: <engines_dir>/<cohort>."""
        return f"{self.state_dir}/engines"

    @property
    def plan_path(self) -> str:
        """Where the agent role writes plan.json on every node."""
        return f"{self.config_dir}/plan.json"

    @property
    def lock_dir(self) -> str:
        return self.lock_path.rsplit("/", 1)[0] or "/"

    @property
    def model_view(self) -> str:
        """Where every engine unit sees the model directory of its revision (a read-only bind mount of model_dir,
        deployment/units.py): one path for every revision. Dynamo's model card names its files by path, and
        Dynamo 1.6.1's frontend drops a model and adds it again when the card of its workers changes (404s for
        30-40 ms, measured): with one path, a new revision with the same configuration and tokenizer keeps the
        card, and a revision switch keeps the model served. A Slurm job's engines name model_dir itself."""
        return model_view_dir(self.state_dir)

    @property
    def residency(self) -> str:
        """The GMS residency of this plan's weights: its model revision's label (``residency_of``)."""
        return residency_of(self.revision)

    @property
    def gms_dir(self) -> str:
        """The GMS server's socket directory (``GMS_SOCKET_DIR`` of the server and every engine): one per residency
        below ``socket_dir``, so that a new model revision gets a GMS server of its own beside the one serving."""
        return gms_dir(self.socket_dir, self.revision)

    def unit_name(self, kind: str, cohort: int | None = None) -> str:
        """shadowline-<deployment>-<kind>.service, the engine instance (cohort given) / template name, or the GMS
        server of this plan's residency."""
        return unit_name(self.deployment, kind, self.residency if kind == "gms" else cohort)

    def agent_lock_path(self, host: str) -> str:
        return f"{self.state_dir}/agent-{host}.lock"

    @property
    def nats_store_dir(self) -> str:
        """NATS JetStream's store (the infra hosts' NATS configuration names it)."""
        return nats_store_dir(self.state_dir)


def nats_store_dir(state_dir: str) -> str:
    return f"{state_dir}/nats"


def unit_name(deployment: str, kind: str, instance: int | str | None = None) -> str:
    """The one rule for unit names: shadowline-<deployment>-<kind>.service; engines are one instance per cohort of
    a template unit, GMS servers one unit per residency (``shadowline-<deployment>-gms@<residency>.service``)."""
    base = f"shadowline-{deployment}-{kind}"
    if kind in INSTANCED_UNITS:
        return f"{base}@{instance}.service" if instance is not None else f"{base}@.service"
    return f"{base}.service"


INSTANCED_UNITS = ("engine", "gms")
_RESIDENCY_RE = re.compile(r"[^A-Za-z0-9_.-]")


def model_view_dir(state_dir: str) -> str:
    """The engines' view of their revision's model directory (Plan.model_view)."""
    return f"{state_dir}/model"


def residency_of(revision: str) -> str:
    """The GMS residency of a model revision: its first 12 characters (a commit's short id), characters a systemd
    instance name or a directory would have to escape replaced by ``_``."""
    return _RESIDENCY_RE.sub("_", revision)[:12] or "unpinned"


def gms_dir(socket_dir: str, revision: str) -> str:
    """A revision's GMS socket directory below the deployment's socket directory (the failover lock stays in
    the latter: every cohort of every revision contends for one lock)."""
    return residency_dir(socket_dir, residency_of(revision))


def residency_dir(socket_dir: str, residency: str) -> str:
    """The socket directory of a residency (``residency_of``), also of one found installed (gms_units_unplanned)."""
    return f"{socket_dir.rstrip('/')}/rev-{residency}"


def on_host(processes: tuple[Process, ...], host: str) -> Process:
    """The process of ``processes`` that runs on ``host`` (KeyError naming the host when none does)."""
    for process in processes:
        if process.host == host:
            return process
    raise KeyError(f"the plan has no such process on {host}")


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _process(data: dict[str, Any]) -> Process:
    return Process(host=data["host"], argv=tuple(data["argv"]), env=dict(data["env"]),
                   files=dict(data.get("files") or {}))


def _security(data: dict[str, Any]) -> Security:
    known = _known(Security, data)
    return Security(**{**known, "firewall_allow": tuple(known.get("firewall_allow") or ()),
                       "frontend_allow": tuple(known.get("frontend_allow") or ())})


def _node(data: dict[str, Any]) -> Node:
    return Node(host=data["host"], rank=int(data["rank"]), address=data["address"])


def _cohort_from_dict(data: dict[str, Any]) -> CohortPlan:
    ranks = tuple(RankPlan(host=r["host"], address=r["address"], node_rank=int(r["node_rank"]),
                           leader=bool(r["leader"]), headless=bool(r["headless"]), process=_process(r["process"]))
                  for r in data["ranks"])
    return CohortPlan(cohort=int(data["cohort"]), engine_id=int(data["engine_id"]), role=data["role"],
                      ports=CohortPorts(**_known(CohortPorts, data["ports"])), ranks=ranks)


def _plan_from_dict(data: dict[str, Any]) -> Plan:
    infra = data["infra"]
    nodes = tuple(_node(n) for n in data["nodes"])
    gms_servers = tuple(_process(p) for p in data["gms_servers"])
    known = {f.name for f in fields(Plan)}
    return Plan(
        deployment=data["deployment"], backend=data["backend"], state_dir=data["state_dir"],
        config_dir=data["config_dir"], service_user=data["service_user"], gpus_per_node=int(data["gpus_per_node"]),
        ports=Ports(**_known(Ports, data["ports"])), failover=Failover(**_known(Failover, data["failover"])),
        model_id=data["model_id"], model_dir=data["model_dir"], revision=data["revision"],
        socket_dir=data["socket_dir"], lock_path=data["lock_path"], nodes=nodes,
        infra=InfraPlan(hosts=tuple(_node(n) for n in infra["hosts"]), etcd_endpoints=infra["etcd_endpoints"],
                        nats_server=infra["nats_server"], frontend_url=infra["frontend_url"],
                        frontend=_process(infra["frontend"]), etcd=tuple(_process(p) for p in infra["etcd"]),
                        nats=tuple(_process(p) for p in infra["nats"]),
                        etcd_proxies=tuple(_process(p) for p in infra.get("etcd_proxies") or ())),
        gms_servers=gms_servers, cohorts=tuple(_cohort_from_dict(c) for c in data["cohorts"]),
        python=data.get("python") or gms_servers[0].argv[0],
        extra={k: v for k, v in data.items() if k not in known},
        monitoring=Monitoring(**_known(Monitoring, data["monitoring"])) if data.get("monitoring") else None,
        security=_security(data["security"]) if data.get("security") else None,
        container=_container(data["container"]) if data.get("container") else None,
    )


def _container(data: dict[str, Any]) -> Container:
    known = _known(Container, data)
    return Container(**{**known, "devices": tuple(known.get("devices") or ())})


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
    gms_servers = tuple(_gms_server(contract, node) for node in contract.nodes)
    cohorts = tuple(_cohort_plan(contract, infra, security, cohort, model_path) for cohort in range(contract.cohorts))
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
                                        for host in dict.fromkeys(n.host for n in contract.nodes + contract.infra_hosts))
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
    if not security.insecure:
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
    hosts = dict.fromkeys(n.host for n in contract.nodes + contract.infra_hosts)
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
    own client uses every member (control/etcd_client.py)."""
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


def _cohort_plan(contract: Contract, infra: InfraPlan, security: Security, cohort: int,
                 model_path: str) -> CohortPlan:
    ports = cohort_ports(contract.ports, cohort)
    ranks = tuple(_rank_plan(contract, infra, security, cohort, ports, node, model_path) for node in contract.nodes)
    return CohortPlan(cohort=cohort, engine_id=cohort, role="primary" if cohort == 0 else "shadow",
                      ports=ports, ranks=ranks)


def _rank_plan(contract: Contract, infra: InfraPlan, security: Security, cohort: int, ports: CohortPorts,  # noqa: PLR0913 (one rank's inputs)
               node: Node, model_path: str) -> RankPlan:
    engine = contract.engine
    headless = node.rank != 0
    argv = [runtime_python(contract), "-m", backend(engine.backend).engine_module,
            "--model", model_path, "--served-model-name", contract.model.id,
            "--load-format", "gms", *(() if engine.cuda_graphs else ("--enforce-eager",)), "--enable-sleep-mode",
            "--tensor-parallel-size", str(engine.tensor_parallel_size)]
    if engine.nnodes > 1:
        argv += ["--distributed-executor-backend", "mp", "--nnodes", str(engine.nnodes),
                 "--node-rank", str(node.rank), "--master-addr", contract.leader.address,
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


def shell_quote(arg: str) -> str:
    safe = all(c.isalnum() or c in "@%+=:,./-_" for c in arg)
    return arg if arg and safe else "'" + arg.replace("'", "'\"'\"'") + "'"


def restart_order(cohorts: list[int], serving: int | None) -> list[int]:
    """The order to (re)start cohorts in: on a new deployment the primary first; on a running one the parked
    shadows first and the serving cohort last, so a parked shadow takes over while it restarts."""
    ordered = sorted(cohorts)
    if serving is None or serving not in ordered:
        return ordered
    return [c for c in ordered if c != serving] + [serving]
