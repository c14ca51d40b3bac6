"""The drill faults of both paths, defined once: what each one does, where it lands, what the drill expects of the
agents afterwards, and which path drills it.

``FAULTS``: the agents' deployments (playbooks/drill.yml, drill/node.py). The serving cohort is the lock holder
(``engine-<id>`` in the lock file on the leader node). Node-level faults (kill-gms, kill-agent, cut-node) take a
node; the default is the one that tests the most (see ``Fault.node``), ``target`` overrides it.

``SLURM_FAULTS``: a Slurm job (slurm/drill, drill/slurm.py): the same faults where the job can have them, each
hitting the serving cohort's step on the node ``Fault.node`` names (``leader``: the job's first node, ``last``:
its last), the way ``Fault.slurm`` says (drill/slurm_fault.py), plus ``scancel-step``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common.lock import parse_holder
from ..common.policy import CANARY_UNANSWERED, GENERATION_STALLED, GPU_FAULT, GPU_XID
from ..deployment.plan import Plan


class DrillError(Exception):
    """A drill cannot run as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Fault:
    name: str
    summary: str
    cohort: str  # "serving", "standby" or "" (a node-level fault)
    node: str  # "leader" (node rank 0) or "last" (the highest node rank, never the leader)
    expect_failure: bool  # the agents must declare a generation failed
    expect_reason: tuple[str, ...]  # failure-declared reasons that count as detecting it
    expect_promotion: bool  # another cohort must take the lock
    zero_failed: bool  # not one request may fail
    min_observe_s: float  # watch at least this long after the fault before calling it settled
    multi_node: bool = False  # needs a second node
    rank_hook: bool = False  # needs the backend's per-rank fault control file (Backend.rank_fault_file)
    gpu_xid: int = 0  # a fake GPU health event with this Xid on the node's first GPU (Backend.fake_gpu_uuids)
    fences: bool = False  # the fault takes a GPU out of service: the node is fenced; the drill unfences it after
    systemd: bool = True  # drilled on the agents' deployments (playbooks/drill.yml)
    # Drilled on a Slurm job: what the fault task does to the step's engine rank on the target node, "kill"
    # (SIGKILL), "stop" (SIGSTOP of its process group: a hang) or "none" (the drill triggers the failover itself);
    # "" where a Slurm job has no such fault.
    slurm: str = ""


VOCABULARY: tuple[Fault, ...] = (
    Fault("kill-leader", "SIGKILL the serving cohort's leader (node rank 0) main process",
          "serving", "leader", True, ("rank-exited",), True, False, 0.5, slurm="kill"),
    Fault("kill-worker", "SIGKILL the serving cohort's rank on the last node",
          "serving", "last", True, ("rank-exited",), True, False, 0.5, multi_node=True, slurm="kill"),
    Fault("hang-leader", "freeze the serving leader's whole engine (SIGSTOP of every process of its unit)",
          "serving", "leader", True, ("leader-hung",), True, False, 0.5, slurm="stop"),
    Fault("hang-worker", "freeze the serving cohort's headless rank on the last node (SIGSTOP of every process "
          "of its unit): vLLM's /health stays 200, generation stops", "serving", "last", True,
          (GENERATION_STALLED, CANARY_UNANSWERED), True, False, 0.5, multi_node=True, slurm="stop"),
    Fault("stall-generation", "a rank stuck in its collective, its process and the leader's /health up (the "
          "backend's rank control file: hang-collective) on the serving cohort's last-node rank", "serving",
          "last", True, (GENERATION_STALLED, CANARY_UNANSWERED), True, False, 0.5, multi_node=True,
          rank_hook=True),
    Fault("gpu-xid-app", "Xid 31 (a GPU memory page fault: NVIDIA resolves it by restarting the application) on "
          "the leader node's GPU, from the stand-in's GPU event file", "serving", "leader", True, (GPU_XID,), True,
          False, 0.5, gpu_xid=31),
    Fault("gpu-xid-fatal", "Xid 79 (the GPU has fallen off the bus: the node needs service) on the last node's "
          "GPU: every cohort fails, the node is fenced, nothing serves until the drill unfences it", "", "last",
          True, (GPU_FAULT,), False, False, 0.5, multi_node=True, gpu_xid=79, fences=True),
    Fault("kill-standby", "SIGKILL a parked shadow's leader: serving must not notice",
          "standby", "leader", True, ("rank-exited",), False, True, 0.5),
    Fault("kill-gms", "SIGKILL the GMS server on one node: mapped weights survive, serving continues",
          "", "leader", False, (), False, False, 3.0),
    Fault("kill-agent", "SIGKILL one node's agent: systemd restarts it and it adopts the running ranks",
          "", "leader", False, (), False, True, 4.0),
    Fault("cut-node", "take a non-leader node's network down for a few seconds, then up again",
          "", "last", False, (), False, False, 1.0, multi_node=True),
    Fault("scancel-step", "scancel J.S of the serving cohort's step (the manual failover trigger)",
          "serving", "leader", False, (), True, False, 0.5, systemd=False, slurm="none"),
)

FAULTS: dict[str, Fault] = {f.name: f for f in VOCABULARY if f.systemd}
SLURM_FAULTS: dict[str, Fault] = {f.name: f for f in VOCABULARY if f.slurm}


def fault_names() -> list[str]:
    return list(FAULTS)


def fault(name: str) -> Fault:
    """The fault called ``name``; a DrillError naming every fault otherwise (the playbook's only check)."""
    if name not in FAULTS:
        raise DrillError(f"fault={name!r} is not a drill fault. Fix: one of {', '.join(FAULTS)} (-e fault=kill-leader)")
    return FAULTS[name]


def choose_target(plan: Plan, name: str, holder: str | None, host: str | None = None,
                  cohort: int | None = None) -> dict[str, Any]:
    """Where fault ``name`` lands: {host, cohort, node_rank} (cohort None for node-level faults)."""
    spec = fault(name)
    nodes = plan.nodes  # in rank order: nodes[0] is the leader node
    if spec.multi_node and len(nodes) < 2:
        raise DrillError(f"{name} needs a node other than the leader; this deployment has one node")
    serving = parse_holder(holder or "")
    if spec.cohort and serving is None:
        raise DrillError("no cohort holds the failover lock: nothing serves, so there is nothing to drill. "
                         "Fix: playbooks/status.yml, then playbooks/site.yml")
    chosen = cohort
    if spec.cohort == "serving":
        chosen = serving if cohort is None else cohort
    elif spec.cohort == "standby" and cohort is None:
        parked = [c for c in plan.cohort_ids if c != serving]
        if not parked:
            raise DrillError("kill-standby needs a parked shadow; this deployment has one cohort (gms_cohorts: 1)")
        chosen = parked[0]
    if host is None:
        host = nodes[0].host if spec.node == "leader" else nodes[-1].host
    if host not in plan.hosts:
        raise DrillError(f"target {host!r} is not a node of deployment {plan.deployment}")
    node = plan.node(host)
    if name == "cut-node" and node.rank == 0:
        raise DrillError("cut-node takes a non-leader node: the leader node holds etcd, the frontend and the lock")
    if name in ("kill-leader", "hang-leader", "kill-standby") and node.rank != 0:
        raise DrillError(f"{name} hits a cohort leader, which runs on the leader node {nodes[0].host}")
    if name in ("kill-worker", "hang-worker", "stall-generation") and node.rank == 0:
        raise DrillError(f"{name} hits a headless rank: choose a node other than the leader")
    if spec.gpu_xid and not fake_gpu(plan, host):
        raise DrillError(f"{name} writes a fake GPU event, which the stand-in reads and the {plan.backend} backend "
                         f"does not (its GPUs' events come from NVML). Fix: drill {name} on a stand-in deployment")
    if spec.rank_hook and rank_fault_file(plan, chosen or 0, node.rank) is None:
        raise DrillError(f"{name} needs a per-rank fault control file, which the stand-in has and the "
                         f"{plan.backend} backend does not. Fix: drill {name} on a stand-in deployment")
    return {"host": host, "cohort": chosen if spec.cohort else None, "node_rank": node.rank,
            "summary": spec.summary, "expect_failure": spec.expect_failure, "min_observe_s": spec.min_observe_s}


def fake_gpu(plan: Plan, host: str) -> str | None:
    """The GPU a drill's fake GPU event names on ``host`` (its first), None where the backend has no fake events."""
    uuids = plan.engine.fake_gpu_uuids(plan.deployment, host, plan.gpus_per_node)
    return uuids[0] if uuids else None


def rank_fault_file(plan: Plan, cohort: int, node_rank: int) -> str | None:
    """The backend's fault control file of a cohort's rank (None: the backend has none)."""
    return plan.engine.rank_fault_file(plan.lock_dir, plan.cohort(cohort).engine_id, node_rank)


def cut_unit_name(plan: Plan) -> str:
    return plan.unit_name("drill-cut")
