"""gms_engine: the engine's shape, arguments and environment, parsed into a typed ``Engine`` (contract.py's part).

How many nodes one engine group spans (``nnodes``: one replica's size, deployment/replicas.py), its tensor
parallel size, GPUs per node, the arguments a user adds and the environment of every rank; flags and names the
plan sets itself are refused here, each with its field and fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..backends import NAMES as BACKENDS
from ..common.values import Reader, describe

DEFAULT_ENGINE: dict[str, Any] = {
    "backend": "dynamo_vllm",
    "tensor_parallel_size": 1,
    "nnodes": None,  # default: the number of hosts in gms_nodes
    "gpus_per_node": 1,
    "extra_args": [],
    # engines' discovery lease (ETCD_LEASE_TTL), Dynamo's own default. Dynamo 1.6.1 ends an engine whose lease
    # keep-alive has failed for this long (an etcd outage), so it is also how long an etcd outage every engine
    # survives (less one keep-alive period); a dead engine's lease is revoked by the agents at once, not waited for.
    "lease_ttl_s": 30,
    # Engine environment variables the site needs (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, GLOO_SOCKET_IFNAME on multi-NIC
    # nodes): rendered into every rank's unit and the Slurm job; never a secret (units and the plan are readable)
    "env": {},
    # CUDA graphs: false renders --enforce-eager, the one mode every GMS shadow build accepts (docs/gpu-cluster.md)
    "cuda_graphs": False,
}
# Flags shadowline sets itself from the plan; a user who puts them in extra_args would fight the plan.
MANAGED_FLAGS = {
    "--model": "gms_model.local_dir", "--served-model-name": "gms_model.id", "--load-format": "(always gms)",
    "--tensor-parallel-size": "gms_engine.tensor_parallel_size", "--nnodes": "gms_engine.nnodes",
    "--node-rank": "gms_node_rank", "--master-addr": "gms_node_address of the leader node",
    "--master-port": "gms_ports.master_base and gms_ports.master_stride", "--headless": "(set on ranks other than 0)",
    "--distributed-executor-backend": "(always mp for several nodes)",
    "--distributed-timeout-seconds": "gms_failover.collective_timeout_s",
    "--enforce-eager": "gms_engine.cuda_graphs (false, the default, renders it)",
}
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# names that say a secret: the engines' environment is written into unit files and the plan, which any local user
# and every Ansible run may read (a token goes in a file: gms_model_hf_token_file)
SECRET_NAME_RE = re.compile(r"TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL|PRIVATE|ACCESS_KEY|API_KEY|(^|_)KEY$", re.I)
ENV_VALUE_MAX = 4096


@dataclass(frozen=True)
class Engine:
    backend: str
    tensor_parallel_size: int
    nnodes: int
    gpus_per_node: int
    extra_args: tuple[str, ...]
    lease_ttl_s: int
    env: tuple[tuple[str, str], ...] = ()  # gms_engine.env, sorted by name
    cuda_graphs: bool = False


def parse_engine(read: Reader, value: Any, node_count: int) -> Engine | None:
    values = read.mapping("gms_engine", value, DEFAULT_ENGINE)
    backend = read.choice("gms_engine.backend", values["backend"], BACKENDS)
    tp = read.integer("gms_engine.tensor_parallel_size", values["tensor_parallel_size"], minimum=1, maximum=1024, example=8)
    nnodes_value = values["nnodes"] if values["nnodes"] is not None else node_count
    nnodes = read.integer("gms_engine.nnodes", nnodes_value, minimum=1, maximum=1024, example=node_count)
    gpus = read.integer("gms_engine.gpus_per_node", values["gpus_per_node"], minimum=1, maximum=64, example=8)
    lease = read.integer("gms_engine.lease_ttl_s", values["lease_ttl_s"], minimum=1, maximum=600, example=30)
    extra = read.string_list("gms_engine.extra_args", values["extra_args"], "['--max-model-len', '8192']")
    if extra:
        for arg in extra:
            flag = arg.split("=", 1)[0]
            if flag in MANAGED_FLAGS:
                read.problem("gms_engine.extra_args", f"contains {flag}, which shadowline sets from the plan.",
                             f"remove it from extra_args; it comes from {MANAGED_FLAGS[flag]}.")
    env = _parse_engine_env(read, values["env"])
    cuda_graphs = read.boolean("gms_engine.cuda_graphs", values["cuda_graphs"])
    if None in (backend, tp, nnodes, gpus, lease, env, cuda_graphs) or extra is None:
        return None
    if not (backend is not None and tp is not None and nnodes is not None and gpus is not None and lease is not None
            and env is not None and cuda_graphs is not None):
        raise AssertionError("unreachable: checked above")
    return Engine(backend=backend, tensor_parallel_size=tp, nnodes=nnodes, gpus_per_node=gpus,
                  extra_args=tuple(extra), lease_ttl_s=lease, env=env, cuda_graphs=cuda_graphs)


def _parse_engine_env(read: Reader, value: Any) -> tuple[tuple[str, str], ...] | None:
    """gms_engine.env: NAME: value pairs for every rank. A name is a shell identifier, not one shadowline sets
    (SHADOWLINE_*, HOME; the plan's own names are refused where the plan is built: deployment/plan_builder.py), never one
    that says a secret; a value is a string or a number on one line. Nothing of a value is ever put in a message."""
    example = "{NCCL_SOCKET_IFNAME: ens1f0, NCCL_IB_HCA: mlx5_0}"
    if value is None or value == {}:
        return ()
    if not isinstance(value, dict):
        read.problem("gms_engine.env", f"must be a mapping of variable names to values, got {describe(value)}.",
                     f"write it as a YAML mapping, e.g. {example}.")
        return None
    pairs: list[tuple[str, str]] = []
    ok = True
    for name, raw in value.items():
        field_name = f"gms_engine.env.{name}"
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            read.problem("gms_engine.env", f"has the name {name!r}, which is no environment variable name.",
                         "use letters, digits and '_', not starting with a digit, e.g. NCCL_SOCKET_IFNAME.")
            ok = False
        elif name.upper().startswith("SHADOWLINE_") or name.upper() == "HOME":
            read.problem(field_name, "is set by shadowline itself for every rank.", "remove it from gms_engine.env.")
            ok = False
        elif SECRET_NAME_RE.search(name):
            read.problem(field_name, "looks like a secret; the engines' environment is written into unit files, the "
                                     "plan and the Slurm job, which are not secret.",
                         "remove it; give a Hugging Face token with gms_model_hf_token_file, and keep other "
                         "credentials in a file the service user reads (docs/security.md).")
            ok = False
        elif isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            read.problem(field_name, f"must be a string or a number, got {describe(raw) if isinstance(raw, bool) else type(raw).__name__}.",
                         f"quote the value in YAML, e.g. {name}: \"1\".")
            ok = False
        elif isinstance(raw, str) and (len(raw) > ENV_VALUE_MAX or any(ord(c) < 32 or ord(c) == 127 for c in raw)):
            read.problem(field_name, f"has a control character (a newline, a tab) or more than {ENV_VALUE_MAX} "
                                     "characters.", "write the value on one line, without tabs.")
            ok = False
        else:
            pairs.append((name, raw if isinstance(raw, str) else str(raw)))
    return tuple(sorted(pairs)) if ok else None


def check_tensor_parallel(read: Reader, engine: Engine) -> None:
    """The tensor parallel size fits one replica (``nnodes`` nodes of ``gpus_per_node`` GPUs) and splits evenly
    over its nodes."""
    total = engine.gpus_per_node * engine.nnodes
    tp = engine.tensor_parallel_size
    if tp > total:
        read.problem("gms_engine.tensor_parallel_size",
                     f"{tp} does not fit {engine.nnodes} node(s) x {engine.gpus_per_node} GPU(s) = {total} GPU(s).",
                     f"lower tensor_parallel_size to at most {total}, or raise gms_engine.gpus_per_node or add nodes.")
    elif tp % engine.nnodes != 0:
        read.problem("gms_engine.tensor_parallel_size",
                     f"{tp} does not split evenly over {engine.nnodes} nodes; every rank needs the same number of GPUs.",
                     f"use a multiple of {engine.nnodes}, e.g. {engine.nnodes * engine.gpus_per_node}.")
