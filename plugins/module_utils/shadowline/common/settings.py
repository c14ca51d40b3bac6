"""The typed settings a contract parses (contract.py) and a plan carries (plan.py): ports, failover timing,
monitoring, nodes, the container image, a cohort's ports, with the defaults their fields fall back on.

Values only, importing nothing of the library: the runtime's readers of a plan (the node agent, the modules,
the filters) load a Plan without the contract's parsing, the PKI or the container policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_PORTS: dict[str, int] = {
    "frontend": 8000,
    "master_base": 29500,
    "master_stride": 100,
    "system_base": 8080,
    "nixl_base": 8280,
    "etcd_client": 2379,
    "etcd_peer": 2380,
    "nats": 4222,
    "nats_monitor": 8222,
    "nats_cluster": 6222,
    "agent_metrics": 8480,
    # every host, on loopback: the etcd proxy that gives Dynamo's engines and frontend etcd over TLS (Dynamo 1.6.1's
    # etcd client has no TLS); one port per etcd member from this one (deployment/plan_builder.py, _etcd_proxy)
    "etcd_proxy": 23790,
}
DEFAULT_FAILOVER: dict[str, Any] = {
    "health_timeout_s": 2.0,  # a leader whose /health does not answer this long is hung
    "term_grace_s": 0.0,  # SIGTERM grace before SIGKILL when tearing down a failed generation
    "planned_grace_s": 5.0,  # SIGTERM grace of a planned failover (playbooks/failover.yml): engines drain
    "agent_lease_ttl_s": 3,  # an agent gone this long counts as a lost node
    "relaunch_backoff_s": 0.2,  # first delay before relaunching a slot that failed again soon after launch
    "relaunch_backoff_max_s": 30.0,
    "max_relaunch_attempts": 5,  # consecutive quick failures before the slot is marked dead
    "stable_after_s": 30.0,  # a generation that ran this long resets the attempt count
    # a shadow that took the lock but is not active this long after is failed and the next one takes over:
    # above the 3.8-16 s promotions measured on 8x B200 and GMS's fixed 30 s admission deadline
    "wake_timeout_s": 60.0,
    # Real-engine signals (docs/detection.md): requests running and vLLM's generated-token counter still this long
    # is a stalled generation; it must exceed the longest prefill the deployment serves (vLLM counts no token
    # while it prefills a prompt).
    "progress_stall_s": 60.0,
    "canary_interval_s": 5.0,  # an idle serving cohort gets a one-token completion this often (finds idle hangs)
    # The process-group timeout of the engines' collectives (vLLM's --distributed-timeout-seconds) and the torch
    # NCCL watchdog's heartbeat timeout: a rank stuck in a collective this long ends its process. torch's own
    # default; it applies from the first collective, so it must exceed the skew of weight loading between ranks.
    "collective_timeout_s": 600,
    # the spare nodes (gms_spares) the deployment must have at least: preflight refuses fewer; monitoring alerts
    # when fewer are ready (docs/fleet.md, Spare nodes). 0: spares are optional
    "min_spares": 0,
}
# gms_frontend_tls: the OpenAI API in plain HTTP (the default), over HTTPS with the frontend host's certificate of
# the deployment's CA, or over HTTPS that also wants a client certificate of that CA (docs/security.md).
# (Not "off": YAML reads an unquoted off as false.)
FRONTEND_TLS_PLAIN, FRONTEND_TLS_ON, FRONTEND_TLS_MUTUAL = "plain", "tls", "mutual"
FRONTEND_TLS_MODES = [FRONTEND_TLS_PLAIN, FRONTEND_TLS_ON, FRONTEND_TLS_MUTUAL]
# gms_frontend_router_mode: how the frontend picks a worker among the replicas' serving ones (Dynamo 1.6.1's
# --router-mode, whose default is round-robin: rendered only when another is chosen). kv routes on the prefixes
# each worker caches, as its KV events tell the frontend; the engines as the plan renders them send none (Dynamo
# 1.6.1's dynamo.vllm without --kv-events-config; the stand-in's mocker on NATS, which the frontend ignores), so kv
# routes on load alone (docs/fleet.md). least-loaded and power-of-two route on requests in flight. Dynamo's direct
# and device-aware-weighted are left out (a request naming its worker; CPU and GPU workers mixed).
FRONTEND_ROUTER_MODES = ["round-robin", "random", "power-of-two", "least-loaded", "kv"]
DEFAULT_ROUTER_MODE = FRONTEND_ROUTER_MODES[0]


@dataclass(frozen=True)
class Ports:
    frontend: int
    master_base: int
    master_stride: int
    system_base: int
    nixl_base: int
    etcd_client: int
    etcd_peer: int
    nats: int
    nats_monitor: int
    nats_cluster: int
    agent_metrics: int
    etcd_proxy: int = DEFAULT_PORTS["etcd_proxy"]  # a default: plans written before it had none


@dataclass(frozen=True)
class Failover:
    health_timeout_s: float
    term_grace_s: float
    planned_grace_s: float
    agent_lease_ttl_s: int
    relaunch_backoff_s: float
    relaunch_backoff_max_s: float
    max_relaunch_attempts: int
    stable_after_s: float
    # Added after plans were first written: defaults keep an older plan.json readable.
    wake_timeout_s: float = DEFAULT_FAILOVER["wake_timeout_s"]
    progress_stall_s: float = DEFAULT_FAILOVER["progress_stall_s"]
    canary_interval_s: float = DEFAULT_FAILOVER["canary_interval_s"]
    collective_timeout_s: int = DEFAULT_FAILOVER["collective_timeout_s"]
    min_spares: int = DEFAULT_FAILOVER["min_spares"]


@dataclass(frozen=True)
class Monitoring:
    mode: str  # server | targets | none
    host: str  # the inventory host that runs Prometheus (server) or holds the targets files (targets)
    address: str  # that host's address: Prometheus listens there
    port: int
    blackbox_port: int
    scrape_interval_s: int
    retention_days: int


@dataclass(frozen=True)
class Node:
    host: str
    rank: int
    address: str


@dataclass(frozen=True)
class Container:
    image: str
    archive: str  # a `podman save` archive on the controller, loaded on every node instead of a pull ("": pull)
    runtime: str  # the OCI runtime podman runs ("": podman's default)
    devices: tuple[str, ...]  # --device: CDI names (nvidia.com/gpu=all) or device paths
    python: str  # the interpreter in the image that runs `python -m <module>` (on the image's PATH, or absolute)


@dataclass(frozen=True)
class CohortPorts:
    master: int
    system: int
    nixl: int
