"""The cohort plan, typed: every process of a deployment with its argv and environment, as the runtime reads it.

Roles, Slurm templates, Ansible modules, the node agent and the stand-in all consume a Plan (or its dict form,
``Plan.to_dict``/``Plan.from_dict``, the one boundary with Ansible). A Plan is made from a parsed Contract by
plan_builder.py only; this module imports neither the contract's parsing, the PKI nor the container policy,
so that a reader of a plan (the agent, a module, a filter) loads none of them.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ..backends import Backend, backend
from ..common.settings import (
    FRONTEND_TLS_MUTUAL,
    FRONTEND_TLS_PLAIN,
    CohortPorts,
    Container,
    Failover,
    Monitoring,
    Node,
    Ports,
)


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
        """Rank 0: runs the Dynamo runtime, serves /health and /metrics, takes the failover lock. A fleet's cohort
        (Plan.cohorts with several replicas) has one per replica: ask the replica's (Plan.replica(q).cohort(c))."""
        leaders = [r for r in self.ranks if r.leader]
        if len(leaders) > 1:
            raise ValueError(f"cohort {self.cohort} has a leader in each of {len(leaders)} replicas "
                             f"({', '.join(r.host for r in leaders)}): use plan.replica(q).cohort({self.cohort}) "
                             "or plan.replica_of(host)")
        return leaders[0]

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
    def etcd_jwt_key(self) -> str:
        """The key etcd signs its auth tokens with (the same on every member: a token one issued, every one takes);
        infra hosts only."""
        return f"{self.dir}/etcd-jwt.key"

    @property
    def etcd_jwt_pub(self) -> str:
        return f"{self.dir}/etcd-jwt.pub"

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


@dataclass(frozen=True)
class Replica:
    """One engine group of the deployment (docs/fleet-design.md): its nodes, their ranks, its own leader node,
    master address and failover lock, and its cohorts: the cohort numbers and ports of every replica are the
    same, on its own hosts. A deployment of one replica is today's deployment."""
    id: int
    members: tuple[str, ...]  # hosts in rank order (membership epoch 1): members[0] is the leader node
    master_address: str  # the leader node's address: every cohort's --master-addr
    master_port: int  # cohort 0's master port (cohort c's: gms_ports.master_stride further), every replica's
    lock_path: str  # the failover lock, on the leader node
    cohorts: tuple[CohortPlan, ...]  # this replica's ranks of each cohort

    @property
    def leader(self) -> str:
        """The replica's leader node (rank 0): its cohorts' leaders, its failover lock and its driver."""
        return self.members[0]

    def cohort(self, cohort: int) -> CohortPlan:
        return self.cohorts[cohort]

    def rank_of(self, host: str) -> int:
        return self.members.index(host)

    def to_dict(self) -> dict[str, Any]:
        """What plan.json keeps of a replica: its cohorts' ranks are the plan's own (Plan.cohorts), by host."""
        return {"id": self.id, "members": list(self.members), "leader": self.leader,
                "master_address": self.master_address, "master_port": self.master_port, "lock_path": self.lock_path,
                "cohorts": [c.cohort for c in self.cohorts]}


def spare_hosts(plan: Plan) -> list[str]:
    """The spare nodes (gms_spares): a GMS server and an agent each, no rank."""
    return [n.host for n in plan.spares]


def gpu_hosts(plan: Plan) -> list[str]:
    """Every host with a GMS server and an agent: the nodes, then the spares."""
    return plan.hosts + spare_hosts(plan)


def replica_view(replica_id: int, members: tuple[str, ...], master_address: str, master_port: int, lock_path: str,
                 cohorts: tuple[CohortPlan, ...]) -> Replica:
    """A replica with its own ranks of the deployment's ``cohorts`` (those on its members, in rank order)."""
    order = {host: rank for rank, host in enumerate(members)}
    own = tuple(CohortPlan(cohort=c.cohort, engine_id=c.engine_id, role=c.role, ports=c.ports,
                           ranks=tuple(sorted((r for r in c.ranks if r.host in order), key=lambda r: order[r.host])))
                for c in cohorts)
    return Replica(id=replica_id, members=members, master_address=master_address, master_port=master_port,
                   lock_path=lock_path, cohorts=own)


ETCD_USERS = ("root", "agent", "dynamo")  # the deployment's etcd identities (cluster/access.py grants them)


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
    # the replicas (docs/fleet-design.md): one engine group each, their cohorts' ranks those of ``cohorts`` on
    # their members. Empty when made: one replica of every node (today's deployment, an older plan.json). A
    # dataclasses.replace of nodes or cohorts keeps the old replicas: pass replicas=() with them to derive again
    replicas: tuple[Replica, ...] = ()
    # gms_spares (deployment/spares.py): hosts with a GMS server (in gms_servers, after the nodes') and an agent,
    # and no rank; relocation gives one a rank of a replica whose node was lost (docs/fleet-design.md)
    spares: tuple[Node, ...] = ()

    def __post_init__(self) -> None:
        if not self.replicas and self.nodes:
            master = self.nodes[0]
            one = replica_view(0, tuple(n.host for n in self.nodes), master.address, self.ports.master_base,
                               self.lock_path, self.cohorts)
            object.__setattr__(self, "replicas", (one,))

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
        # the replicas by name: their cohorts' ranks are ``cohorts``' (asdict wrote each rank a second time)
        data["replicas"] = [r.to_dict() for r in self.replicas]
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
        """Node rank 0: every cohort's leader, the failover lock and the agents' driver live there. A fleet has
        one per replica: ask ``replica(q).leader`` or ``replica_of(host).leader``."""
        if len(self.replicas) > 1:
            raise ValueError(f"deployment {self.deployment} has {len(self.replicas)} replicas, each with its own "
                             "leader node: use plan.replica(q).leader or plan.replica_of(host).leader")
        return self.nodes[0]

    # --- the replicas (docs/fleet-design.md) ------------------------------------------------------------------
    @property
    def fleet(self) -> bool:
        """Whether the deployment has more than one replica."""
        return len(self.replicas) > 1

    def replica(self, replica: int) -> Replica:
        """Replica ``replica`` by its number (KeyError naming the numbers there are)."""
        for one in self.replicas:
            if one.id == replica:
                return one
        raise KeyError(f"deployment {self.deployment} has no replica {replica} "
                       f"(replicas: {', '.join(str(r.id) for r in self.replicas)})")

    def for_replica(self, replica: int) -> Plan:
        """The plan as one replica's agents drive it: its nodes (their ranks its own), its ranks of every cohort,
        its GMS servers and lock; the deployment's infra, model and settings. Its one replica keeps its number (the
        records' keys name it). A deployment of one replica is its own."""
        if len(self.replicas) == 1 and self.replicas[0].id == replica:
            return self
        own = self.replica(replica)
        nodes = {n.host: n for n in self.nodes}
        return replace(self, nodes=tuple(nodes[h] for h in own.members), cohorts=own.cohorts,
                       gms_servers=tuple(p for p in self.gms_servers if p.host in own.members),
                       lock_path=own.lock_path, replicas=(own,))

    def replica_of(self, host: str) -> Replica:
        """The replica ``host`` is a node of (KeyError naming the host when none)."""
        for replica in self.replicas:
            if host in replica.members:
                return replica
        raise KeyError(f"{host} is not a node of deployment {self.deployment} (nodes: {', '.join(self.hosts)})")

    @property
    def hosts(self) -> list[str]:
        return [n.host for n in self.nodes]

    def gpu_node(self, host: str) -> Node:
        """The node or spare ``host`` (KeyError naming both lists when neither)."""
        for node in self.nodes + self.spares:
            if node.host == host:
                return node
        raise KeyError(f"{host} is neither a node nor a spare of deployment {self.deployment} (nodes: "
                       f"{', '.join(self.hosts)}; spares: {', '.join(spare_hosts(self)) or 'none'})")

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


def sole_replica(plan: Plan) -> int:
    """The number of the one replica ``plan`` holds: a deployment of one, or one replica's own plan
    (Plan.for_replica: what a drill or the operator's failover of that replica is given). ValueError for a whole
    fleet, which names no replica."""
    if plan.fleet:
        raise ValueError(f"deployment {plan.deployment} is a fleet of {len(plan.replicas)} replicas: name one "
                         "(plan.for_replica(q))")
    return plan.replicas[0].id


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


def _replicas(data: list[dict[str, Any]] | None, cohorts: tuple[CohortPlan, ...]) -> tuple[Replica, ...]:
    """The replicas of plan.json (none in an older one: then the plan's one replica, Plan.__post_init__)."""
    by_number = {c.cohort: c for c in cohorts}
    return tuple(replica_view(int(r["id"]), tuple(r["members"]), r["master_address"], int(r["master_port"]),
                              r["lock_path"], tuple(by_number[int(c)] for c in r["cohorts"]))
                 for r in data or ())


def _plan_from_dict(data: dict[str, Any]) -> Plan:
    infra = data["infra"]
    nodes = tuple(_node(n) for n in data["nodes"])
    gms_servers = tuple(_process(p) for p in data["gms_servers"])
    cohorts = tuple(_cohort_from_dict(c) for c in data["cohorts"])
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
        gms_servers=gms_servers, cohorts=cohorts, replicas=_replicas(data.get("replicas"), cohorts),
        python=data.get("python") or gms_servers[0].argv[0],
        extra={k: v for k, v in data.items() if k not in known},
        monitoring=Monitoring(**_known(Monitoring, data["monitoring"])) if data.get("monitoring") else None,
        security=_security(data["security"]) if data.get("security") else None,
        container=_container(data["container"]) if data.get("container") else None,
        spares=tuple(_node(n) for n in data.get("spares") or ()),
    )


def _container(data: dict[str, Any]) -> Container:
    known = _known(Container, data)
    return Container(**{**known, "devices": tuple(known.get("devices") or ())})


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
