"""The Slurm job as the supervisor's parts share it (slurm/supervisor.py): the batch script's spec, the job's
identity, directory and event log, the allocation's nodes and the concrete plan, the step slots, the serving
cohort, the stop asked for, the messages to the loop; and ``job.json``, the record of it in the job directory."""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time
from typing import Any

from ..common.etcd_client import Etcd
from ..common.events import EventLog
from ..common.policy import RelaunchPolicy
from ..deployment.plan import Plan
from ..model.fsutil import atomic_write_json
from .allocation import Node, read_spec
from .options import SlurmOptions
from .slots import StepSlot


class Fatal(Exception):
    """The job cannot run: recorded, then everything is stopped and the supervisor exits 1."""


class Stopping(Exception):
    """A stop was asked for (signal) while starting up."""


class JobState:
    """One per job. ``job_dir`` and ``events`` exist from JobStart.start_job on, ``etcd`` from install_secrets."""

    def __init__(self, script: str) -> None:
        self.script = os.path.abspath(script)
        with open(self.script, encoding="utf-8") as f:
            spec = read_spec(f.read())
        self.options = SlurmOptions.from_dict(spec["slurm"])
        self.spec_plan = Plan.from_dict(spec["plan"])  # node addresses are the tokens @SL_ADDR_<i>@
        self.relaunch = RelaunchPolicy.of(self.spec_plan.failover)
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        if not self.job_id:
            raise SystemExit("shadowline.slurm.supervisor runs inside a Slurm job (sbatch the rendered script)")
        self.host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.started = time.time()
        self.stop_reason: str | None = None
        self.exit_code = 0
        self.job_dir = ""
        self.events: EventLog
        self.etcd: Etcd
        self.nodes: list[Node] = []
        self.plan: Plan | None = None  # the spec's plan with the allocation's addresses (once known)
        self.messages: queue.Queue[tuple[Any, ...]] = queue.Queue()  # to the loop: states, leases, task events
        self.slots: dict[str, StepSlot] = {}
        self.serving: int | None = None
        self.last_served: int | None = None
        self.job_lock = threading.Lock()

    @property
    def job_plan(self) -> Plan:
        """The concrete plan; known from start_job on (before it, nothing reads it)."""
        if self.plan is None:
            raise Fatal("the plan is not known before the allocation is read")
        return self.plan

    def write_job(self, state: str = "running") -> None:
        with self.job_lock:
            atomic_write_json(os.path.join(self.job_dir, "job.json"), {
                "job_id": self.job_id, "job_name": os.environ.get("SLURM_JOB_NAME"), "state": state,
                "batch_host": self.host, "script": self.script, "job_dir": self.job_dir,
                "nodes": [{"name": n.name, "address": n.address} for n in self.nodes],
                "frontend_url": self.plan.infra.frontend_url if self.plan else None,
                "model_id": self.plan.model_id if self.plan else None,
                "serving": self.serving, "node_dir": self.options.node_dir, "python": sys.executable,
                "library_dir": self.options.library_dir,
                "steps": {name: [s.record() for s in slot.history] for name, slot in self.slots.items()},
                "plan": self.plan.to_dict() if self.plan else {},
            }, durable=False)
