"""Preflight: every check that must pass before anything changes on any host, all problems at once.

Input: each host's variables (hostvars), the host lists of gms_nodes and gms_infra, and the read-only
node facts gathered by node_facts.gather on each node. Output: the Contract (when valid) and every problem.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..backends import backend
from ..common.problems import Problem
from .contract import PATH_EXAMPLES, Contract, parse_contract
from .node_facts import NETWORK_FILESYSTEMS
from .plan import Plan, residency_of
from .plan_builder import checked_plan, insecure_warning
from .platforms import platform_problems
from .ports import host_port_uses
from .secrets_guard import controller_digests, minting_problems

GIB = 1024 ** 3


@dataclass
class PreflightResult:
    contract: Contract | None
    plan: Plan | None
    problems: list[Problem]
    checks: list[str] = field(default_factory=list)  # what was checked, for the report
    warnings: list[str] = field(default_factory=list)  # what passes but the user should know (plan_warnings)


def run_preflight(hostvars: dict[str, dict[str, Any]], node_hosts: list[str], infra_hosts: list[str],
                  facts: dict[str, dict[str, Any] | None], spare_hosts: list[str] | None = None) -> PreflightResult:
    contract, problems = parse_contract(hostvars, node_hosts, infra_hosts, spare_hosts)
    checks = ["variable names and types", "node ranks (unique, contiguous, one leader)",
              "engine shape (nnodes, tensor parallel size, GPUs per node)", "model pin and weight format"]
    if contract is None:
        return PreflightResult(None, None, problems, checks)
    plan, refused = checked_plan(contract)  # the plan's own refusals (its ports), as every path gets them
    problems += refused
    checks.append(f"replicas: {len(contract.replicas)} of {contract.engine.nnodes} node(s) each, complete and "
                  "of one shape")
    problems += private_tmp_problems(contract)
    uses = host_port_uses(contract)
    checks.append(f"{sum(len(of_host) for of_host in uses.values())} ports of {len(uses)} host(s): range and "
                  "collisions on each host")
    for node in _all_hosts(contract):
        host_facts = facts.get(node)
        if host_facts is None:
            problems.append(Problem("(facts)", "no node facts were gathered (was the host reachable?).",
                                    "make the host reachable over SSH and run preflight again.", host=node))
            continue
        refused = privilege_problems(node, host_facts.get("privilege"))
        if refused:  # nothing else was gathered there
            problems += refused
            continue
        problems += _listening_problems(contract, node, host_facts)
        problems += _lock_problems(contract, node, host_facts)
        problems += _gpu_problems(contract, node, host_facts)
        problems += _python_problems(contract, node, host_facts)
        problems += _token_file_problems(contract, node, host_facts)
        problems += platform_problems(node, host_facts.get("platform"),
                                      infra=node in {n.host for n in contract.infra_hosts})
    checks += ["root on every host (directly or by become)", "distribution and Python of every host", "ports already listening on each node",
               "lock path on a local filesystem, creatable", "GPU count and memory budget (where nvidia-smi or sizes are known)"]
    runtime_modules = backend(contract.engine.backend).runtime_modules
    if runtime_modules:
        checks.append(f"runtime Python imports {' and '.join(runtime_modules)}")
    problems += _memory_problems(contract, facts)
    problems += _security_switch_problems(contract, facts)
    checks.append("gms_insecure unchanged on a running deployment")
    if not contract.insecure:
        problems += _secrets_problems(contract, facts)
        checks.append("gms_secrets_dir holds the CA and passwords the running hosts use")
    if problems:
        return PreflightResult(contract, None, problems, checks)
    return PreflightResult(contract, plan, problems, checks, plan_warnings(contract))


ONE_REPLICA_AT_A_TIME = {  # playbook -> why it acts on one replica of a fleet at a time
    "upgrade.yml": "it upgrades one replica at a time (its shadows first, then its serving cohort hands over), so "
                   "that every other replica serves throughout",
}


def fleet_refusal(plan: Plan, playbook: str, replica: object = "") -> str:
    """Why ``playbook`` refuses this deployment before it changes anything ("": it does not). A fleet
    (docs/fleet.md) is deployed, torn down, paused, staged and watched by every playbook; those of
    ONE_REPLICA_AT_A_TIME act on one replica and need ``replica`` (the ``-e replica=q`` given, "" for none)."""
    if not plan.fleet or playbook not in ONE_REPLICA_AT_A_TIME or str(replica) != "":
        return ""
    last = len(plan.replicas) - 1
    return (f"replica: the deployment is a fleet of {len(plan.replicas)} replicas and {playbook} takes one: "
            f"{ONE_REPLICA_AT_A_TIME[playbook]}. Nothing was changed. Fix: run it for each replica in turn, "
            f"-e replica=0 then -e replica=1 ... -e replica={last} (docs/fleet.md); `make status` shows each "
            "replica's lock holder.")


PRIVATE_TMP = ("/tmp/", "/var/tmp/")  # every unit runs with PrivateTmp=yes (deployment/units.py HARDENING)


def private_tmp_problems(contract: Contract) -> list[Problem]:
    """Paths the units share, under /tmp or /var/tmp: each unit has its own there (PrivateTmp), so the GMS server's
    socket would be invisible to the engines, and each engine would lock its own failover lock (two cohorts
    serving at once). A Slurm job's steps have no such sandbox (slurm/job.py puts them under node_dir)."""
    shared = {"gms_socket_dir": contract.socket_dir, "gms_lock_path": contract.lock_path,
              "gms_model.local_dir": contract.model.local_dir, "gms_python": contract.python}
    return [Problem(field, f"is {path}, under {'/tmp' if path.startswith('/tmp/') else '/var/tmp'}: every unit of "
                    "the deployment has a /tmp and /var/tmp of its own (systemd's PrivateTmp), so the units would "
                    "not share it (the GMS socket, the failover lock, the model, the runtime).",
                    f"set {field} to a path outside /tmp and /var/tmp, such as {PATH_EXAMPLES[field]}.")
            for field, path in shared.items() if path and path.startswith(PRIVATE_TMP)]


def plan_warnings(contract: Contract) -> list[str]:
    """What passes preflight but limits the deployment: a plain control plane (gms_insecure), one cohort."""
    warnings = [insecure_warning(contract.deployment)] if contract.insecure else []
    if contract.cohorts == 1:
        warnings.append(f"gms_cohorts is 1: deployment {contract.deployment} has a primary cohort and no shadow, so "
                        "nothing can take over when it fails: serving stops until it is relaunched. Set gms_cohorts: "
                        "2 or more for shadow-engine failover (a shadow adds no weight memory, only "
                        "gms_memory.engine_overhead_gib per GPU).")
    return warnings


def _all_hosts(contract: Contract) -> list[str]:
    hosts = [n.host for n in contract.nodes + contract.spares]
    return hosts + [n.host for n in contract.infra_hosts if n.host not in hosts]


def _gpu_hosts(contract: Contract) -> set[str]:
    """The hosts checked as GPU nodes: the nodes, and the spares (gms_spares), which may take any node's place."""
    return {n.host for n in contract.nodes + contract.spares}


def _listening_problems(contract: Contract, host: str, facts: dict[str, Any]) -> list[Problem]:
    wanted = {}
    for use in host_port_uses(contract).get(host, []):
        wanted.setdefault(use.port, use)
    problems = []
    for sock in facts.get("listening") or []:
        use = wanted.get(sock["port"])
        if use is None or sock.get("ours"):
            continue
        who = f"{sock.get('process') or 'a process'} (pid {sock.get('pid')})" if sock.get("pid") else "another process"
        problems.append(Problem(use.field, f"port {use.port} ({use.owner}) is already in use by {who} on {sock['address']}.",
                                f"stop that process, or move {use.field} to a free port.", host=host))
    return problems


def _lock_problems(contract: Contract, host: str, facts: dict[str, Any]) -> list[Problem]:
    lock = facts.get("lock_dir")
    if not lock or host not in _gpu_hosts(contract):
        return []
    problems = []
    fstype = lock.get("fstype") or "unknown"
    if fstype in NETWORK_FILESYSTEMS:
        problems.append(Problem("gms_lock_path", f"{contract.lock_path} is on {fstype} ({lock.get('mountpoint')}); "
                                "flock is not reliable on network or parallel filesystems.",
                                "put the lock on node-local storage, e.g. the default /run/shadowline/<deployment>/gms.",
                                host=host))
    if not lock.get("ancestor_is_dir"):
        problems.append(Problem("gms_lock_path", f"{lock.get('existing_ancestor')} is in the way and is not a directory.",
                                "choose a lock path whose parent directories are directories.", host=host))
    elif lock.get("read_only"):
        problems.append(Problem("gms_lock_path", f"{lock.get('mountpoint')} is mounted read-only, so "
                                f"{lock.get('path')} cannot be created.", "put the lock on a writable local filesystem.",
                                host=host))
    if lock.get("exists") and lock.get("writable_by_service_user") is False:
        problems.append(Problem("gms_lock_path", f"{lock.get('path')} exists but {contract.service_user} cannot write it.",
                                f"chown it to {contract.service_user} or remove it so the roles create it.", host=host))
    return problems


def _gpu_problems(contract: Contract, host: str, facts: dict[str, Any]) -> list[Problem]:
    gpus = facts.get("gpus")
    if gpus is None or host not in _gpu_hosts(contract):
        return []
    if any("error" in g for g in gpus):
        return [Problem("gms_engine.gpus_per_node", f"nvidia-smi failed: {gpus[0]['error']}.",
                        "fix the NVIDIA driver on this node (nvidia-smi must list the GPUs).", host=host)]
    if len(gpus) != contract.engine.gpus_per_node and host in {n.host for n in contract.spares}:
        return [Problem("gms_spares", f"the spare {host} has {len(gpus)} GPU(s) (nvidia-smi), the nodes "
                        f"{contract.engine.gpus_per_node} (gms_engine.gpus_per_node): a spare takes a node's rank and "
                        "must have its GPUs.", f"give gms_spares hosts of {contract.engine.gpus_per_node} GPU(s), or "
                        f"remove {host} from gms_spares.", host=host)]
    if len(gpus) != contract.engine.gpus_per_node:
        return [Problem("gms_engine.gpus_per_node", f"is {contract.engine.gpus_per_node} but nvidia-smi lists "
                        f"{len(gpus)} GPU(s) on this node.",
                        f"set gms_engine.gpus_per_node to {len(gpus)}, or fix the node.", host=host)]
    return []


RUNTIME_MODES = ("venv", "wheelhouse", "external", "container")


def _python_problems(contract: Contract, host: str, facts: dict[str, Any]) -> list[Problem]:
    """The runtime's source, before python_env builds anything: by python_env_mode. ``external``: the interpreter
    exists and finds the backend's modules; ``wheelhouse``: the directory holds a wheel of every distribution the
    backend is built from; ``venv``: only for runtimes the package index has (not gpu-memory-service). Facts
    without a mode (an older preflight_facts) are judged as ``external``."""
    if host not in _gpu_hosts(contract):
        return []
    strategy = backend(contract.engine.backend)
    mode = facts.get("runtime_mode") or "external"
    if mode not in RUNTIME_MODES:
        return [Problem("python_env_mode", f"is {mode!r}.", f"use one of {', '.join(RUNTIME_MODES)}.", host=host)]
    if mode == "venv":
        if "gpu-memory-service" in strategy.runtime_distributions:
            return [Problem("python_env_mode", f"is venv, which installs from the package index, but the "
                            f"{strategy.name} backend needs gpu-memory-service, which is not on PyPI.",
                            "use python_env_mode: container (NVIDIA's vllm-runtime image through podman), or "
                            "wheelhouse with python_env_wheelhouse holding the wheels (docs/gpu-cluster.md, runtime "
                            "delivery), or external with gms_python pointing at an environment that has them.",
                            host=host)]
        return []
    if mode == "wheelhouse":
        return _wheelhouse_problems(strategy.runtime_distributions, host, facts.get("wheelhouse"))
    if mode == "container":
        return _image_problems(contract, host, facts.get("image"))
    return _external_problems(contract, host, facts.get("python"), list(strategy.runtime_modules))


def _image_problems(contract: Contract, host: str, image: dict[str, Any] | None) -> list[Problem]:
    """container: the image's archive (when one is named) is on the controller, where preflight runs; without one
    each node has the image or its registry serves it (node_facts.image_facts asked, read-only; a node without
    podman yet is not asked: python_env installs it, then pulls)."""
    container = contract.container
    if container is None:
        return []
    if container.archive:
        if host != contract.nodes[0].host or os.path.isfile(os.path.expanduser(container.archive)):
            return []
        return [Problem("gms_container.archive", f"{container.archive} is not a file on the controller.",
                        "build it (make standin-image for the stand-in; podman save -o FILE IMAGE for another "
                        "image), or leave gms_container.archive empty to pull the image.")]
    if image and image.get("present") is False and (image.get("pullable") is False or image.get("error")):
        return [Problem("gms_container.image", f"{container.image} is not on this node and cannot be pulled: "
                        f"{image.get('error')}.", "log in to the registry as root (podman login), make it "
                        "reachable, or set gms_container.archive to a podman save of the image.", host=host)]
    return []


def _external_problems(contract: Contract, host: str, python: dict[str, Any] | None,
                       runtime_modules: list[str]) -> list[Problem]:
    if python is None or not runtime_modules:
        return []
    if not python.get("exists"):
        return [Problem("gms_python", f"{contract.python} does not exist or is not executable.",
                        "install the engine runtime (a venv or container with ai-dynamo, vLLM and "
                        "gpu_memory_service) and point gms_python at its interpreter, or let python_env build "
                        "it (python_env_mode: wheelhouse).", host=host)]
    missing = [name for name, ok in (python.get("modules") or {}).items() if not ok]
    if python.get("error"):
        missing = runtime_modules
    if missing:
        return [Problem("gms_python", f"{contract.python} cannot import {', '.join(missing)}.",
                        "install ai-dynamo[vllm] and NVIDIA's gpu_memory_service into that environment.", host=host)]
    return []


def _wheelhouse_problems(needed: tuple[str, ...], host: str, wheelhouse: dict[str, Any] | None) -> list[Problem]:
    if not wheelhouse:
        return [Problem("python_env_wheelhouse", "is not set, but python_env_mode is wheelhouse.",
                        "set it to a directory of wheels on every node.", host=host)]
    if not wheelhouse.get("exists"):
        return [Problem("python_env_wheelhouse", f"{wheelhouse.get('path')} cannot be read "
                        f"({wheelhouse.get('error')}).", "copy the wheelhouse to this node, or fix the path.",
                        host=host)]
    missing = [name for name in needed if name not in set(wheelhouse.get("projects") or [])]
    if missing:
        return [Problem("python_env_wheelhouse", f"{wheelhouse.get('path')} has no wheel of {', '.join(missing)}.",
                        "add them (docs/gpu-cluster.md, runtime delivery, says how to fill a wheelhouse).",
                        host=host)]
    return []


def _memory_problems(contract: Contract, facts: dict[str, dict[str, Any] | None]) -> list[Problem]:
    """Weights / TP + KV reserve + per-engine overhead for every cohort must fit one GPU's memory; while the
    inventory names another model revision than the nodes run, the served revision's weights too.

    Shadows add no weight memory (they map the weights GMS already holds); each engine process still
    costs its CUDA context and scratch space, counted by engine_overhead_gib. A new revision needs a GMS
    residency of its own beside the served one until every cohort runs it (the GMS server refuses a new writer
    while readers are attached): the served weights stay resident until playbooks/upgrade.yml (or site.yml)
    retires them.
    """
    memory = contract.memory
    gpu_gib, weights_gib, running = memory.gpu_memory_gib, memory.weights_gib, None
    for node in contract.nodes + contract.spares:  # a spare's GPUs hold the same rank's share
        node_facts = facts.get(node.host) or {}
        gpus = node_facts.get("gpus") or []
        sizes = [g["memory_mib"] / 1024 for g in gpus if "memory_mib" in g]
        if gpu_gib is None and sizes:
            gpu_gib = min(sizes)
        if weights_gib is None and node_facts.get("manifest_weight_bytes"):
            weights_gib = node_facts["manifest_weight_bytes"] / GIB
        running = running or node_facts.get("running_model")
    switching = bool(running) and residency_of(running["revision"]) != residency_of(contract.model.revision)
    if weights_gib is None and switching and running.get("weight_bytes"):
        weights_gib = running["weight_bytes"] / GIB  # not staged yet: a new revision of the same size assumed
    if gpu_gib is None or weights_gib is None:
        return []
    tp = contract.engine.tensor_parallel_size
    need = weights_gib / tp + memory.kv_reserve_gib + memory.engine_overhead_gib * contract.cohorts
    parts = (f"weights {_gib(weights_gib)} GiB / TP {tp} + KV reserve {memory.kv_reserve_gib:g} GiB + "
             f"{contract.cohorts} engines x {memory.engine_overhead_gib:g} GiB overhead")
    if need > gpu_gib:
        return [Problem("gms_memory", f"each GPU needs {_gib(need)} GiB ({parts}) but has {_gib(gpu_gib)} GiB.",
                        "raise gms_engine.tensor_parallel_size, lower gms_memory.kv_reserve_gib or gms_cohorts.")]
    if not switching:
        return []
    served_gib = running["weight_bytes"] / GIB if running.get("weight_bytes") else weights_gib
    served_tp = running.get("tensor_parallel_size") or tp
    both = need + served_gib / served_tp
    if both <= gpu_gib:
        return []
    return [Problem("gms_model.revision",
                    f"switching the served revision {running['revision']} to {contract.model.revision} keeps both in "
                    f"GPU memory until every cohort runs the new one: each GPU needs {_gib(both)} GiB (the served "
                    f"revision's weights {_gib(served_gib)} GiB / TP {served_tp} + the new revision's {parts}) but "
                    f"has {_gib(gpu_gib)} GiB.",
                    "free GPU memory for the switch (lower gms_memory.kv_reserve_gib or gms_cohorts), or switch "
                    "with a gap: playbooks/teardown.yml, then playbooks/site.yml with the new revision.")]


def _security_switch_problems(contract: Contract, facts: dict[str, dict[str, Any] | None]) -> list[Problem]:
    """gms_insecure switched on a running deployment: refused. etcd's authentication (kept in its data) and its
    members' peer URLs are set when the members are created, so the switched clients would all be refused (the
    frontend and engines then exit at start: seen on the testbed, a plain frontend against etcd with
    authentication on, "etcdserver: user name is empty")."""
    running = {facts_of.get("running_secure") for facts_of in facts.values() if facts_of} - {None}
    if not running or (not contract.insecure) in running:
        return []  # (nodes that disagree: a switch made before this check; either setting may repair it)
    secured = contract.insecure  # what runs is the other setting
    now = "secured (etcd authentication and TLS, NATS TLS)" if secured else "plain (gms_insecure: true)"
    return [Problem("gms_insecure", f"deployment {contract.deployment} runs with its control plane {now}; "
                    f"gms_insecure: {str(contract.insecure).lower()} cannot switch it in place: etcd keeps its "
                    "authentication and peer URLs from when its members were created, and every client would be "
                    "refused.",
                    f"keep gms_insecure as it is ({'unset' if secured else 'true'}), or run "
                    "playbooks/teardown.yml first and then site.yml with the new setting.")]


def _token_file_problems(contract: Contract, host: str, facts: dict[str, Any]) -> list[Problem]:
    """gms_model_hf_token_file is read on each node by the model module (for hf:// sources): checked there, where
    it is read, by the module's own rules (node_facts.token_file_facts); the docs' examples once put it on the
    controller, where nothing reads it."""
    token = facts.get("hf_token_file")
    if not token or token.get("ok") or not (contract.model.source or "").startswith("hf://"):
        return []
    if host not in _gpu_hosts(contract):
        return []
    return [Problem("gms_model_hf_token_file", str(token.get("message", "cannot be read")),
                    str(token.get("fix") or "install it on every node, 0600, owned by root."), host=host)]


def privilege_problems(host: str, privilege: dict[str, Any] | None) -> list[Problem]:
    """The roles install packages, systemd units, a firewall and directories under /etc, /var/lib and /run: refused
    at once when the modules run as another user than root, instead of deep inside site.yml."""
    if not privilege or privilege.get("uid") == 0:
        return []
    return [Problem("ansible_become", f"the modules run as {privilege.get('user')} (uid {privilege.get('uid')}) "
                    "on this host, not as root: the roles install packages, systemd units and a firewall.",
                    "connect as root (ansible_user: root), or keep your SSH user and set ansible_become: true for "
                    "the deployment's hosts (that user needs sudo rights: README.md, Requirements).", host=host)]


def _secrets_problems(contract: Contract, facts: dict[str, dict[str, Any] | None]) -> list[Problem]:
    """A controller without this deployment's secrets (or with another's) would make new ones over those its
    hosts run with (deployment/secrets_guard.py): refused unless gms_secrets_rotate."""
    where = os.path.abspath(os.path.expanduser(contract.secrets_dir))
    installed = {host: host_facts.get("installed_secrets") for host, host_facts in facts.items() if host_facts}
    return minting_problems(contract.deployment, where, controller_digests(where), installed, contract.secrets_rotate)


def _gib(value: float) -> str:
    """GiB for a message: one decimal, or 3 significant digits below 1 GiB (a test model's weights are not 0.0)."""
    return f"{value:.1f}" if value >= 1 else f"{value:.3g}"
