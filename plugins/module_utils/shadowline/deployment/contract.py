"""The inventory contract: the variables a user sets, their defaults, and their parsing into typed values.

This is the one place that knows variable names and defaults, with its parts in modules of their own: the nodes
and their replicas (replicas.py), gms_engine (engine_contract.py), gms_model (model_contract.py), the container
image (container.py). ``parse_contract`` takes each host's variables as Ansible sees them (hostvars) and returns
a ``Contract`` plus every problem found; it never raises on bad input. The cohort plan (plan.py) is built
(plan_builder.py) from a Contract only.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from ..common.problems import Problem
from ..common.settings import (
    DEFAULT_FAILOVER,
    DEFAULT_PORTS,
    DEFAULT_ROUTER_MODE,
    FRONTEND_ROUTER_MODES,
    FRONTEND_TLS_MODES,
    FRONTEND_TLS_PLAIN,
    Container,
    Failover,
    Monitoring,
    Node,
    Ports,
)
from ..common.values import SYSTEM_DIRECTORIES, Reader, close_match, describe, suggest
from .addresses import address_problem, address_source, host_address, same_address
from .container import RUNTIME_MODE, parse_container
from .engine_contract import Engine, check_tensor_parallel, parse_engine
from .model_contract import Model, check_model_policy, default_local_dir, parse_model
from .replicas import NODE_VARIABLES, REPLICA_VARIABLES, Placement, arrange, default_nnodes, parse_placements
from .spares import SPARES_GROUP, check_pool, parse_spares

DEPLOYMENT_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$")

DEFAULT_MEMORY: dict[str, Any] = {
    "gpu_memory_gib": None,  # default: measured with nvidia-smi when present
    "weights_gib": None,  # default: the staged model's manifest when present
    "kv_reserve_gib": 0,
    "engine_overhead_gib": 3.0,  # a parked engine's context, graphs, communicators (docs/gpu-cluster.md: 1.28 GiB floor)
}
DEFAULT_MONITORING: dict[str, Any] = {
    "mode": "server",  # server: Prometheus on `host`; targets: only the file_sd targets there; none: nothing
    "host": None,  # default: the first infra host (the leader node when gms_infra is empty)
    "port": 9090,  # Prometheus's web port (its HTTP API) on the host's address
    "blackbox_port": 9115,  # the blackbox exporter that probes NATS, on 127.0.0.1 of the host
    "scrape_interval_s": 5,
    "retention_days": 15,
}
MONITORING_MODES = ["server", "targets", "none"]
DEFAULT_COHORTS = 2
NODES_GROUP, INFRA_GROUP = "gms_nodes", "gms_infra"  # the inventory's groups of a deployment (the playbooks' hosts)
# Where the infra hosts' servers are (gms_binaries): the paths of Debian's and Ubuntu's etcd-server and nats-server
# packages; another packaging (or a binary from upstream's releases) sets them (docs/gpu-cluster.md, Platforms).
DEFAULT_BINARIES: dict[str, str] = {"etcd": "/usr/bin/etcd", "nats_server": "/usr/sbin/nats-server",
                                    "haproxy": "/usr/sbin/haproxy"}
DEFAULT_PYTHON = "/opt/shadowline/{deployment}/venv/bin/python"
ETCD_MEMBER_COUNTS = (1, 3)  # etcd's members: one infra host (or the leader node), or three for a quorum
STATE_DIR = "/var/lib/shadowline/{deployment}"  # etcd and NATS data, the frontend's HOME, event logs
CONFIG_DIR = "/etc/shadowline/{deployment}"
DEFAULT_SERVICE_USER = "shadowline"
# the controller's directory of a deployment's CA, certificates and passwords (gms_secrets_dir), never in a checkout
DEFAULT_SECRETS_DIR = "~/.shadowline/secrets/{deployment}"


# Every variable of the contract, so a misspelt one is reported instead of silently ignored.
KNOWN_VARIABLES = [
    "gms_node_rank", "gms_node_address", "gms_deployment", "gms_model", "gms_engine", "gms_cohorts", "gms_ports",
    "gms_socket_dir", "gms_lock_path", "gms_python", "gms_service_user", "gms_memory", "gms_frontend_bind",
    "gms_model_allow_unpinned", "gms_model_allow_pickle", "gms_model_verify", "gms_model_hf_token_file",
    "gms_failover", "gms_slurm",
    "gms_monitoring", "gms_insecure", "gms_secrets_dir", "gms_secrets_rotate", "gms_firewall_allow", "gms_frontend_allow",
    "gms_frontend_tls", "gms_frontend_router_mode", "gms_binaries", "gms_container", *REPLICA_VARIABLES,
]
# Shared variables must be the same on every node of a deployment.
SHARED_VARIABLES = [v for v in KNOWN_VARIABLES if v not in NODE_VARIABLES]


@dataclass(frozen=True)
class Memory:
    gpu_memory_gib: float | None
    weights_gib: float | None
    kv_reserve_gib: float
    engine_overhead_gib: float


@dataclass(frozen=True)
class Binaries:
    etcd: str = DEFAULT_BINARIES["etcd"]
    nats_server: str = DEFAULT_BINARIES["nats_server"]
    haproxy: str = DEFAULT_BINARIES["haproxy"]  # every host: the etcd proxy of Dynamo's processes (plan_builder.py)


@dataclass(frozen=True)
class Contract:
    deployment: str
    nodes: tuple[Node, ...]  # fleet order: replica 0's nodes by rank, then replica 1's ...; rank in the replica
    infra_hosts: tuple[Node, ...]
    model: Model
    engine: Engine
    cohorts: int
    ports: Ports
    socket_dir: str
    lock_path: str
    python: str
    service_user: str
    memory: Memory
    frontend_bind: str
    failover: Failover
    allow_unpinned: bool = False
    allow_pickle: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    monitoring: Monitoring | None = None
    insecure: bool = False  # gms_insecure: etcd and NATS without authentication or TLS (an explicit opt-out)
    secrets_dir: str = ""  # gms_secrets_dir on the controller (absolute, ~ expanded by the controller's plugins)
    secrets_rotate: bool = False  # gms_secrets_rotate: replace a running deployment's CA and passwords on purpose
    firewall_allow: tuple[str, ...] = ()  # gms_firewall_allow: more sources the host firewall lets in
    frontend_allow: tuple[str, ...] = ()  # gms_frontend_allow: who may reach the frontend (empty: anyone)
    frontend_tls: str = FRONTEND_TLS_PLAIN  # gms_frontend_tls: plain, tls (HTTPS) or mutual (HTTPS, client certificates)
    frontend_router_mode: str = DEFAULT_ROUTER_MODE  # gms_frontend_router_mode (settings.py)
    binaries: Binaries = Binaries()  # gms_binaries: the etcd and nats-server executables on the infra hosts
    container: Container | None = None  # python_env_mode container: the image the GPU processes run from
    spares: tuple[Node, ...] = ()  # gms_spares: hosts with a GMS server and an agent and no rank (spares.py)

    @property
    def replicas(self) -> tuple[tuple[Node, ...], ...]:
        """The replicas (engine groups of gms_engine.nnodes nodes each), their nodes in rank order; one for
        today's deployments (deployment/replicas.py)."""
        size = self.engine.nnodes
        return tuple(self.nodes[i:i + size] for i in range(0, len(self.nodes), size))

    @property
    def leader(self) -> Node:
        """The leader node of the one replica; a fleet has one per replica (``replicas``), so none here."""
        if len(self.nodes) > self.engine.nnodes:
            raise ValueError(f"deployment {self.deployment} has {len(self.replicas)} replicas, each with its own "
                             "leader node: use contract.replicas[q][0]")
        return self.nodes[0]


def default_socket_dir(deployment: str) -> str:
    return f"/run/shadowline/{deployment}/gms"


def default_lock_path(socket_dir: str) -> str:
    return socket_dir.rstrip("/") + "/failover.lock"


def effective_paths(deployment: Any, socket_dir: Any = None, lock_path: Any = None) -> tuple[str | None, str | None]:
    """Socket dir and lock path with defaults applied, or None where they cannot be known."""
    if not socket_dir and isinstance(deployment, str) and DEPLOYMENT_RE.match(deployment):
        socket_dir = default_socket_dir(deployment)
    if not isinstance(socket_dir, str) or not socket_dir:
        return None, lock_path if isinstance(lock_path, str) and lock_path else None
    if not lock_path:
        lock_path = default_lock_path(socket_dir)
    return socket_dir, lock_path if isinstance(lock_path, str) else None


def effective_python(deployment: Any, python: Any) -> str | None:
    if isinstance(python, str) and python:
        return python
    if isinstance(deployment, str) and DEPLOYMENT_RE.match(deployment):
        return DEFAULT_PYTHON.format(deployment=deployment)
    return None


def effective_local_dir(model: Any) -> str | None:
    if not isinstance(model, dict):
        return None
    if isinstance(model.get("local_dir"), str) and model["local_dir"]:
        return model["local_dir"]
    if isinstance(model.get("id"), str) and isinstance(model.get("revision"), str):
        return default_local_dir(model["id"], model["revision"])
    return None


def missing_group_problem(group: str, groups: dict[str, Any] | None = None,
                          hosts_needed: str = "one host per GPU node, each with gms_node_rank (an example: "
                          "inventories/local/hosts.yml)") -> Problem:
    """The deployment's group of nodes has no host (empty, missing or misspelt): Ansible would skip every play
    ("no hosts matched") and report success. Named with the groups the inventory does have (``groups``: Ansible's
    magic variable, group name to hosts) and the closest of them."""
    others = {name: list(hosts or []) for name, hosts in (groups or {}).items()
              if name not in ("all", "ungrouped", group)}
    message = ("the group is empty or missing from the inventory, so no play would run on any node (Ansible "
               "skips a play whose hosts match nothing, and the run would look green).")
    if groups is not None:
        listed = ", ".join(f"{name} ({len(hosts)} host{'s' if len(hosts) != 1 else ''})"
                           for name, hosts in sorted(others.items()))
        message += f" The inventory's groups: {listed}." if listed else " The inventory has no other group."
        ungrouped = list((groups or {}).get("ungrouped") or [])
        if ungrouped:
            message += f" Hosts in no group: {', '.join(ungrouped)}."
    fix = f"add a group {group} with {hosts_needed}."
    close = close_match(group, [name for name, hosts in others.items() if hosts])
    if close:
        fix = f"did you mean {close}? Rename that group to {group}, or {fix}"
    return Problem(group, message, fix)


def parse_contract(hostvars: dict[str, dict[str, Any]], node_hosts: list[str],
                   infra_hosts: list[str] | None = None,
                   spare_hosts: list[str] | None = None) -> tuple[Contract | None, list[Problem]]:
    """Parse and check the inventory contract; returns (contract or None, every problem found)."""
    problems: list[Problem] = []
    read = Reader(problems)
    if not node_hosts:
        problems.append(missing_group_problem(NODES_GROUP))
        return None, problems

    _check_unknown_variables(hostvars, node_hosts + (spare_hosts or []), problems)
    shared = _shared_values(hostvars, node_hosts, problems)
    placements = parse_placements(hostvars, node_hosts, problems)

    deployment = read.string("gms_deployment", shared.get("gms_deployment"), "gms_deployment: llama-70b")
    if deployment is not None and not DEPLOYMENT_RE.match(deployment):
        read.problem("gms_deployment", f"{deployment!r} is not 1-40 characters of a-z, 0-9 and inner hyphens.",
                     "use a short lowercase name such as llama-70b; it becomes part of unit names and paths.")
        deployment = None

    model = parse_model(read, shared)
    engine = parse_engine(read, shared.get("gms_engine"), default_nnodes(hostvars, node_hosts))
    nodes, shape = _replicas(placements, engine, default_nnodes(hostvars, node_hosts))
    cohorts = read.integer("gms_cohorts", shared.get("gms_cohorts", DEFAULT_COHORTS), minimum=1, maximum=64, example=2)
    ports = _parse_ports(read, shared.get("gms_ports"))
    memory = _parse_memory(read, shared.get("gms_memory"))
    failover = _parse_failover(read, shared.get("gms_failover"))
    spares = _spares(read, hostvars, spare_hosts or [], node_hosts, shared, failover)
    allow_unpinned = read.boolean("gms_model_allow_unpinned", shared.get("gms_model_allow_unpinned", False))
    allow_pickle = read.boolean("gms_model_allow_pickle", shared.get("gms_model_allow_pickle", False))
    service_user = read.string("gms_service_user", shared.get("gms_service_user", DEFAULT_SERVICE_USER), "shadowline")
    insecure = read.boolean("gms_insecure", shared.get("gms_insecure", False))
    secrets_rotate = read.boolean("gms_secrets_rotate", shared.get("gms_secrets_rotate", False))
    secrets_dir = _secrets_dir(read, shared.get("gms_secrets_dir"), deployment)
    firewall_allow = _networks(read, "gms_firewall_allow", shared.get("gms_firewall_allow", []))
    frontend_allow = _networks(read, "gms_frontend_allow", shared.get("gms_frontend_allow", []))
    frontend_tls = _frontend_tls(read, shared.get("gms_frontend_tls", FRONTEND_TLS_PLAIN), bool(insecure))
    router_mode = read.choice("gms_frontend_router_mode", shared.get("gms_frontend_router_mode", DEFAULT_ROUTER_MODE),
                              FRONTEND_ROUTER_MODES)
    binaries = _parse_binaries(read, shared.get("gms_binaries"))
    container = _parse_runtime_container(read, hostvars, node_hosts, shared, engine)

    socket_dir = shared.get("gms_socket_dir") or (default_socket_dir(deployment) if deployment else None)
    socket_dir = _absolute_path(read, "gms_socket_dir", socket_dir) if socket_dir else None
    lock_path = shared.get("gms_lock_path") or (default_lock_path(socket_dir) if socket_dir else None)
    lock_path = _absolute_path(read, "gms_lock_path", lock_path) if lock_path else None
    if lock_path and lock_path.rsplit("/", 1)[0] in SYSTEM_DIRECTORIES:  # the base role makes it the deployment's
        read.problem("gms_lock_path", f"is {lock_path}, in {lock_path.rsplit('/', 1)[0]}, a system directory: the "
                     "deployment makes the lock's directory its service user's and lets its units write it.",
                     "put the lock in a directory of the deployment's own, such as "
                     f"{PATH_EXAMPLES['gms_lock_path']} (the default).")
        lock_path = None
    python = shared.get("gms_python") or (DEFAULT_PYTHON.format(deployment=deployment) if deployment else None)
    python = _absolute_path(read, "gms_python", python) if python else None
    _check_token_file(read, shared.get("gms_model_hf_token_file"))

    if model is not None:
        check_model_policy(read, model, allow_unpinned, allow_pickle)

    infra = _parse_infra(read, hostvars, nodes, infra_hosts or [])
    _duplicate_addresses(hostvars, node_hosts, infra_hosts or [], problems, spare_hosts or [])
    monitoring = _parse_monitoring(read, shared.get("gms_monitoring"), nodes, infra)
    frontend_bind = shared.get("gms_frontend_bind")
    if frontend_bind is not None and address_problem(frontend_bind, placeholder_ok=False) is not None:
        read.problem("gms_frontend_bind", f"must be an address, got {describe(frontend_bind)}.",
                     "set it to the infra node's cluster address (or 0.0.0.0), or leave it unset for that default.")
        frontend_bind = None
    if frontend_tls not in (None, FRONTEND_TLS_PLAIN) and frontend_bind not in (None, "0.0.0.0", "::", "127.0.0.1") \
            and infra and frontend_bind != infra[0].address:
        read.problem("gms_frontend_tls", f"is {frontend_tls}, but the frontend binds {frontend_bind}, which its "
                     f"certificate does not name (it names {infra[0].host}'s address {infra[0].address}).",
                     "leave gms_frontend_bind unset, or set it to that address or 0.0.0.0.")

    _check_shape(read, engine, nodes, shape)

    if problems:
        return None, problems
    if not (deployment and model and engine and cohorts and ports and memory and nodes and infra and failover):
        raise AssertionError("unreachable: checked above")
    if not (socket_dir and lock_path and python and service_user is not None):
        raise AssertionError("unreachable: checked above")
    contract = Contract(
        deployment=deployment, nodes=tuple(nodes), infra_hosts=tuple(infra), model=model, engine=engine,
        cohorts=cohorts, ports=ports, socket_dir=socket_dir, lock_path=lock_path, python=python,
        service_user=service_user, memory=memory, frontend_bind=str(frontend_bind or infra[0].address),
        failover=failover, allow_unpinned=bool(allow_unpinned), allow_pickle=bool(allow_pickle),
        monitoring=monitoring, insecure=bool(insecure), secrets_dir=secrets_dir or "", secrets_rotate=bool(secrets_rotate),
        firewall_allow=tuple(firewall_allow or ()), frontend_allow=tuple(frontend_allow or ()),
        frontend_tls=frontend_tls or FRONTEND_TLS_PLAIN, binaries=binaries or Binaries(), container=container,
        spares=tuple(spares or ()), frontend_router_mode=router_mode or DEFAULT_ROUTER_MODE,
    )
    return contract, problems


def _check_token_file(read: Reader, token_file: Any) -> None:
    """gms_model_hf_token_file: read on the nodes by the model module (model/hf_token.py), ~ its user's home."""
    if token_file is not None:
        read.path("gms_model_hf_token_file", token_file, PATH_EXAMPLES["gms_model_hf_token_file"], home_ok=True)


def _spares(read: Reader, hostvars: dict[str, dict[str, Any]], spare_hosts: list[str], node_hosts: list[str],  # noqa: PLR0913 (the inputs of one check)
            shared: dict[str, Any], failover: Failover | None) -> list[Node] | None:
    """gms_spares (spares.py), and gms_failover.min_spares against the pool."""
    wanted = {name: shared.get(name) for name in SHARED_VARIABLES}
    wanted["python_env_mode"] = hostvars.get(node_hosts[0], {}).get("python_env_mode") if node_hosts else None
    spares = parse_spares(hostvars, spare_hosts, node_hosts, wanted, read.problems)
    if failover is not None and spares is not None:
        check_pool(read, failover.min_spares, spares)
    return spares


def _replicas(placements: list[Placement] | None, engine: Engine | None,
              nnodes: int) -> tuple[list[Node] | None, list[Problem]]:
    """The nodes in replicas of gms_engine.nnodes (``nnodes`` when gms_engine is refused: then only for the
    infra and monitoring checks, the shape's problems left out) and the problems of the replicas' shape."""
    if placements is None:
        return None, []
    shape: list[Problem] = []
    nodes = arrange(placements, engine.nnodes if engine else nnodes, shape)
    return nodes, shape if engine is not None else []


def _check_shape(read: Reader, engine: Engine | None, nodes: list[Node] | None, shape: list[Problem]) -> None:
    """The replicas' shape (``shape``: their problems), then the tensor parallel size over one replica."""
    read.problems += shape
    if engine is not None and nodes is not None:
        check_tensor_parallel(read, engine)


def _frontend_tls(read: Reader, value: Any, insecure: bool) -> str | None:
    """gms_frontend_tls: plain, tls or mutual; TLS needs the deployment's CA, which gms_insecure does without."""
    mode = read.choice("gms_frontend_tls", value, FRONTEND_TLS_MODES)
    if mode not in (None, FRONTEND_TLS_PLAIN) and insecure:
        read.problem("gms_frontend_tls", f"is {mode}, but gms_insecure is true: the frontend's certificate comes "
                     "from the deployment's CA, which an insecure deployment does not have.",
                     "set gms_insecure: false (the default), or gms_frontend_tls: plain.")
        return None
    return mode


def _networks(read: Reader, name: str, value: Any) -> list[str] | None:
    """gms_firewall_allow, gms_frontend_allow: IP addresses or networks (CIDR) the host firewall lets in."""
    items = read.string_list(name, value, "['10.0.0.0/24', '192.168.1.5']")
    out = []
    for item in items or []:
        try:
            out.append(str(ipaddress.ip_network(item.strip(), strict=False)))
        except ValueError:
            read.problem(name, f"{item!r} is not an IP address or network.",
                         "list addresses or networks in CIDR form, such as 10.0.0.0/24 or 192.168.1.5.")
            return None
    return out


def _secrets_dir(read: Reader, value: Any, deployment: str | None) -> str | None:
    """gms_secrets_dir: a controller directory (absolute or ~/...), by default one per deployment in ~/.shadowline."""
    if value is None:
        return DEFAULT_SECRETS_DIR.format(deployment=deployment) if deployment else None
    if isinstance(value, str) and value.startswith(("/", "~/")) and not any(c.isspace() for c in value):
        return read.path("gms_secrets_dir", value, PATH_EXAMPLES["gms_secrets_dir"], home_ok=True)
    read.problem("gms_secrets_dir", f"must be an absolute path (or ~/...) on the controller, got {describe(value)}.",
                 "leave it unset for ~/.shadowline/secrets/<deployment>, or name a private directory outside any "
                 "checkout, such as /root/.shadowline/secrets/llama-70b.")
    return None


def _check_unknown_variables(hostvars: dict[str, dict[str, Any]], node_hosts: list[str], problems: list[Problem]) -> None:
    seen: set[str] = set()
    for host in node_hosts:
        for name in hostvars.get(host, {}):
            if name.startswith("gms_") and name not in KNOWN_VARIABLES and name not in seen:
                seen.add(name)
                problems.append(Problem(name, "is not a shadowline variable and would be ignored.",
                                        suggest(name, KNOWN_VARIABLES, "the inventory contract")))


def _shared_values(hostvars: dict[str, dict[str, Any]], node_hosts: list[str], problems: list[Problem]) -> dict[str, Any]:
    """Values that must be identical on every node, taken from the first node; differences are problems."""
    first = node_hosts[0]
    shared = {name: hostvars.get(first, {}).get(name) for name in SHARED_VARIABLES}
    shared = {k: v for k, v in shared.items() if v is not None}
    for name in SHARED_VARIABLES:
        for host in node_hosts[1:]:
            if hostvars.get(host, {}).get(name) != hostvars.get(first, {}).get(name):
                problems.append(Problem(name, f"differs between {first} and {host}; a deployment has one value.",
                                        f"set {name} once for the group gms_nodes (group_vars), not per host.",
                                        host=host))
                break
    return shared


def _parse_ports(read: Reader, value: Any) -> Ports | None:
    values = read.mapping("gms_ports", value, DEFAULT_PORTS)
    parsed: dict[str, int] = {}
    for key in DEFAULT_PORTS:
        if key == "master_stride":
            number = read.integer("gms_ports.master_stride", values[key], minimum=1, maximum=10000, example=100)
        else:
            number = read.integer(f"gms_ports.{key}", values[key], minimum=1024, maximum=65535,
                                  example=DEFAULT_PORTS[key])
        if number is not None:
            parsed[key] = number
    if len(parsed) != len(DEFAULT_PORTS):
        return None
    return Ports(**parsed)


def _parse_binaries(read: Reader, value: Any) -> Binaries | None:
    values = read.mapping("gms_binaries", value, DEFAULT_BINARIES)
    paths = {key: _absolute_path(read, f"gms_binaries.{key}", values[key]) for key in DEFAULT_BINARIES}
    if any(path is None for path in paths.values()):
        return None
    return Binaries(**paths)  # type: ignore[arg-type]


def _parse_runtime_container(read: Reader, hostvars: dict[str, dict[str, Any]], node_hosts: list[str],
                             shared: dict[str, Any], engine: Engine | None) -> Container | None:
    """The image of python_env_mode: container (gms_container, the backend's defaults), None in other modes.
    python_env_mode is python_env's variable; the plan needs it because it changes every GPU process's unit."""
    mode = hostvars.get(node_hosts[0], {}).get("python_env_mode")
    if mode != RUNTIME_MODE:
        if shared.get("gms_container") is not None:
            read.problem("gms_container", f"is set, but python_env_mode is {describe(mode or 'venv')}.",
                         "set python_env_mode: container to run from the image, or remove gms_container.")
        return None
    return parse_container(read, shared.get("gms_container"), engine.backend if engine else "")


def _parse_memory(read: Reader, value: Any) -> Memory | None:
    values = read.mapping("gms_memory", value, DEFAULT_MEMORY)
    gpu = read.number("gms_memory.gpu_memory_gib", values["gpu_memory_gib"], 0.001) if values["gpu_memory_gib"] is not None else None
    weights = read.number("gms_memory.weights_gib", values["weights_gib"]) if values["weights_gib"] is not None else None
    kv = read.number("gms_memory.kv_reserve_gib", values["kv_reserve_gib"])
    overhead = read.number("gms_memory.engine_overhead_gib", values["engine_overhead_gib"])
    if kv is None or overhead is None:
        return None
    return Memory(gpu_memory_gib=gpu, weights_gib=weights, kv_reserve_gib=kv, engine_overhead_gib=overhead)


# gms_failover's seconds: (may be 0, the most that makes sense). Timeouts and delays of 0 would switch a
# check off or spin; nan and infinity are never numbers here.
FAILOVER_SECONDS: dict[str, tuple[bool, float]] = {
    "health_timeout_s": (False, 600.0), "term_grace_s": (True, 600.0),
    "planned_grace_s": (True, 3600.0), "relaunch_backoff_s": (False, 3600.0),
    "relaunch_backoff_max_s": (False, 86400.0), "stable_after_s": (False, 86400.0),
    "wake_timeout_s": (False, 3600.0), "progress_stall_s": (False, 3600.0), "canary_interval_s": (False, 3600.0),
}


# gms_failover's counts that may be 0 (the others start at 1)
FAILOVER_MINIMUM = {"min_spares": 0}

# gms_failover keys that are gone, and what replaces them
REMOVED_FAILOVER = {
    "heartbeat_stall_s": "the stand-in's collective heartbeat file is no signal a real engine gives: hangs are "
                         "judged from vLLM's progress metrics; remove it and set gms_failover.progress_stall_s "
                         "(docs/detection.md)",
}


def _parse_failover(read: Reader, value: Any) -> Failover | None:
    if isinstance(value, dict):
        for key in REMOVED_FAILOVER.keys() & value.keys():
            read.problem(f"gms_failover.{key}", "is no longer a setting.", REMOVED_FAILOVER[key] + ".")
        value = {k: v for k, v in value.items() if k not in REMOVED_FAILOVER}
    values = read.mapping("gms_failover", value, DEFAULT_FAILOVER)
    parsed: dict[str, Any] = {}
    for key, default in DEFAULT_FAILOVER.items():
        name = f"gms_failover.{key}"
        if isinstance(default, int):
            parsed[key] = read.integer(name, values[key], minimum=FAILOVER_MINIMUM.get(key, 1), maximum=3600,
                                       example=default)
        else:
            zero_ok, most = FAILOVER_SECONDS[key]
            parsed[key] = read.number(name, values[key], maximum=most, positive=not zero_ok, example=default or 5.0)
    if any(v is None for v in parsed.values()):
        return None
    if parsed["relaunch_backoff_s"] > parsed["relaunch_backoff_max_s"]:
        read.problem("gms_failover.relaunch_backoff_max_s",
                     f"is {parsed['relaunch_backoff_max_s']:g}, below relaunch_backoff_s "
                     f"({parsed['relaunch_backoff_s']:g}): the delay could never grow.",
                     "set relaunch_backoff_max_s to at least relaunch_backoff_s.")
        return None
    return Failover(**parsed)


def _parse_infra(read: Reader, hostvars: dict[str, dict[str, Any]], nodes: list[Node] | None,
                 infra_hosts: list[str]) -> list[Node] | None:
    if not infra_hosts:
        return [nodes[0]] if nodes else None
    if len(infra_hosts) not in ETCD_MEMBER_COUNTS:
        read.problem("gms_infra", f"has {len(infra_hosts)} hosts; etcd needs 1 or 3 members.",
                     "list 1 host (or none: the leader node is used) or 3 hosts in gms_infra.")
        return None
    by_host = {n.host: n for n in nodes or []}
    infra: list[Node] = []
    for host in infra_hosts:
        if host in by_host:
            infra.append(by_host[host])
            continue
        address = host_address(Reader(read.problems, host), hostvars.get(host, {}), host)
        if address is None:
            return None
        infra.append(Node(host=host, rank=-1, address=address))
    return infra


def _duplicate_addresses(hostvars: dict[str, dict[str, Any]], node_hosts: list[str], infra_hosts: list[str],
                         problems: list[Problem], spare_hosts: list[str]) -> None:
    """Two hosts of the deployment with one address are one machine under two inventory names: its ranks, agents,
    etcd members and ports would collide, and the plan would name one address for two nodes. Each pair is named
    with the variable that gave the address; an infra host that is also a node is listed under its own name."""
    seen: dict[str, tuple[str, str, str]] = {}  # address key -> (host, field, group) of the first with it
    nodes, spares = set(node_hosts), set(spare_hosts)
    for host in list(dict.fromkeys(node_hosts + spare_hosts + infra_hosts)):
        field_name, address = address_source(hostvars.get(host, {}), host)
        if address_problem(address) is not None:
            continue  # named by host_address
        group = NODES_GROUP if host in nodes else SPARES_GROUP if host in spares else INFRA_GROUP
        key = same_address(address)
        if key not in seen:
            seen[key] = (host, field_name, group)
            continue
        first, first_field, first_group = seen[key]
        origin = (f"both from {field_name}" if field_name == first_field
                  else f"{first}'s from {first_field}, {host}'s from {field_name}")
        if group in (NODES_GROUP, SPARES_GROUP):
            of = f"of {group}" if group == first_group else f"({first} of {first_group}, {host} of {group})"
            problems.append(Problem(field_name, f"{first} and {host} {of} have the same address {address} "
                                    f"({origin}); every node needs its own: it is the master address, the address "
                                    "the node's engines and agent bind and the one etcd and NATS are given.",
                                    f"set {field_name} of {host} to that node's own IP address or host name; one "
                                    "machine cannot be two nodes.", host=host))
        elif first_group in (NODES_GROUP, SPARES_GROUP):
            what = "node" if first_group == NODES_GROUP else "spare"
            problems.append(Problem(field_name, f"{host} of {INFRA_GROUP} has the address {address} of the {what} "
                                    f"{first} ({origin}): one machine under two inventory names, whose etcd, NATS "
                                    "and etcd proxy would be planned twice.",
                                    f"list {first} itself in {INFRA_GROUP} (the same inventory name), or set "
                                    f"{field_name} of {host} to its own address.", host=host))
        else:
            problems.append(Problem(field_name, f"{first} and {host} of {INFRA_GROUP} have the same address "
                                    f"{address} ({origin}); etcd's and NATS's members each need their own.",
                                    f"set {field_name} of {host} to its own IP address or host name.", host=host))


def _parse_monitoring(read: Reader, value: Any, nodes: list[Node] | None,
                      infra: list[Node] | None) -> Monitoring | None:
    """gms_monitoring: where Prometheus runs (or only its targets files are written) for this deployment."""
    values = read.mapping("gms_monitoring", value, DEFAULT_MONITORING)
    mode = read.choice("gms_monitoring.mode", values["mode"], MONITORING_MODES)
    port = read.integer("gms_monitoring.port", values["port"], minimum=1024, maximum=65535, example=9090)
    blackbox = read.integer("gms_monitoring.blackbox_port", values["blackbox_port"], minimum=1024, maximum=65535,
                            example=9115)
    interval = read.integer("gms_monitoring.scrape_interval_s", values["scrape_interval_s"], minimum=1,
                            maximum=300, example=5)
    retention = read.integer("gms_monitoring.retention_days", values["retention_days"], minimum=1, maximum=3650,
                             example=15)
    hosts = {n.host: n for n in [*(infra or []), *(nodes or [])]}
    host = values["host"] if values["host"] is not None else (infra[0].host if infra else None)
    if host is not None and (not isinstance(host, str) or (hosts and host not in hosts)):
        read.problem("gms_monitoring.host", f"is {describe(host)}, not a host of gms_nodes or gms_infra.",
                     f"set gms_monitoring.host to one of {', '.join(hosts) or 'the deployment hosts'}, "
                     "or leave it unset for the first infra host.")
        return None
    if None in (mode, port, blackbox, interval, retention) or host not in hosts:
        return None
    if port == blackbox:
        read.problem("gms_monitoring.blackbox_port", f"is {port}, the same as gms_monitoring.port.",
                     "give Prometheus and the blackbox exporter different ports (defaults 9090 and 9115).")
        return None
    return Monitoring(mode=mode, host=host, address=hosts[host].address, port=port, blackbox_port=blackbox,
                      scrape_interval_s=interval, retention_days=retention)


PATH_EXAMPLES = {
    "gms_socket_dir": "/run/shadowline/<deployment>/gms",
    "gms_lock_path": "/run/shadowline/<deployment>/gms/failover.lock",
    "gms_python": "/opt/shadowline/<deployment>/venv/bin/python",
    "gms_model.local_dir": "/var/lib/shadowline/models/<name>/<revision>",
    "gms_binaries.etcd": DEFAULT_BINARIES["etcd"],
    "gms_binaries.nats_server": DEFAULT_BINARIES["nats_server"],
    "gms_binaries.haproxy": DEFAULT_BINARIES["haproxy"],
    "gms_secrets_dir": "~/.shadowline/secrets/<deployment>",
    "gms_model_hf_token_file": "/etc/shadowline/hf-token",
}


def _absolute_path(read: Reader, field_name: str, value: Any) -> str | None:
    """A path of the nodes: absolute, normalised, not the root or a system directory, two levels deep at least
    (values.path_problem); a problem naming the field and the fix otherwise."""
    return read.path(field_name, value, PATH_EXAMPLES[field_name])
