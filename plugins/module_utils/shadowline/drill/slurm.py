"""A failover drill on a running Slurm deployment, measured from outside: ``slurm/drill --job J --fault F``.

While a steady load of completions runs through the frontend, it hits the serving (primary) cohort's step:

| fault         | what                                                                            |
|---------------|---------------------------------------------------------------------------------|
| kill-worker   | SIGKILL the primary's headless (worker) rank on the last node                   |
| kill-leader   | SIGKILL the primary's leader rank on the first node                             |
| hang-leader   | SIGSTOP the primary's leader rank and its Dynamo worker (a hang: the watchdog)  |
| hang-worker   | SIGSTOP the primary's headless rank on the last node                            |
| scancel-step  | ``scancel J.S`` of the primary's step (the manual failover trigger)             |

and reports (seconds from the fault; every figure measured, none estimated):

- ``detect_s``: until the system reacted: the watchdog's detection (hangs), Slurm's first kill of a surviving
  process of the step (kills), 0 for ``scancel-step``;
- ``teardown_s``: until no process of the step is left on any node;
- ``promote_s``: until a shadow's leader entered ``active`` (its own failover metrics);
- ``first_ok_s``: until the first successful completion ended that was sent after the first failed one (with
  no failure: the first one sent after the fault);
- ``failed_before_promotion``/``failed_after_promotion``: completions in flight at the fault or sent after it
  that failed, by whether they were sent before or after the promotion (a request sent to a frozen primary
  fails late, when the primary is killed, but it is a failure of the old primary). These definitions are the
  node agent's drill's (drill/report.py), so the figures compare across the two deployments;
- ``orphans``: processes of the torn-down step still running on any node, and discovery registrations
  beyond the new primary's;
- ``relaunch_s``: until the failed cohort's slot held a fresh shadow again, parked (``standby``);
  ``relaunch_started_s``: until the supervisor launched it.

The faults are the drills' one vocabulary (drill/faults.py, ``SLURM_FAULTS``), the load is the drills' one load
client (drill/load.py), and the request figures are the one computation of both paths (drill/outage.py); what
differs is how the inputs are gathered: the fault task's report of every node, the cohort leaders' own failover
state, the supervisor's events.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..cluster import discovery
from ..cluster.access import operator_etcd
from ..cluster.cohort_state import leader_view
from ..common.etcd_client import EtcdError
from ..common.events import read_events
from ..deployment.plan import Plan
from .faults import SLURM_FAULTS as FAULTS
from .faults import DrillError
from .load import Load
from .outage import outage, rel


def job_dir_of(job_id: str) -> str:
    """The job's output directory, from the line the supervisor writes first to the job's stdout."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30,
                         check=False).stdout
    fields = dict(item.split("=", 1) for item in out.split() if "=" in item)
    stdout = fields.get("StdOut")
    if not stdout:
        raise DrillError(f"scontrol does not know job {job_id}")
    try:
        with open(stdout, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("shadowline: job directory "):
                    return line.split("shadowline: job directory ", 1)[1].strip()
    except OSError as err:
        raise DrillError(f"cannot read the job's output {stdout}: {err}; pass --job-dir") from None
    raise DrillError(f"{stdout} names no shadowline job directory yet; is the job running a rendered script?")


def load_job(job_dir: str) -> dict[str, Any]:
    with open(os.path.join(job_dir, "job.json"), encoding="utf-8") as f:
        return json.load(f)


def active_cohort(plan: Plan) -> int:
    """The cohort whose leader reports the active state (the job has no lock file to read from here)."""
    for cohort in plan.cohort_ids:
        view = leader_view(plan, cohort, timeout=1.0)
        if view and view.state == "active":
            return cohort
    raise DrillError("no cohort is serving (no leader reports the active state)")


def parked_cohorts(plan: Plan) -> list[int]:
    found = []
    for cohort in plan.cohort_ids:
        view = leader_view(plan, cohort, timeout=1.0)
        if view and view.state == "standby":
            found.append(cohort)
    return found


class Watcher(threading.Thread):
    """Polls every cohort leader's failover state (20 ms): when a shadow turns active, when the slot parks again."""

    def __init__(self, plan: Plan, failed: int, since: float) -> None:
        super().__init__(name="drill-watch", daemon=True)
        self.plan, self.failed, self.since = plan, failed, since
        self.promoted: tuple[int, float] | None = None  # (cohort, state entered at)
        self.parked: float | None = None  # when the failed slot's fresh shadow entered standby
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and (self.promoted is None or self.parked is None):
            for cohort in self.plan.cohort_ids:
                view = leader_view(self.plan, cohort, timeout=0.2)
                if view is None or view.state_entered is None or view.state_entered < self.since:
                    continue
                if cohort != self.failed and view.state == "active" and self.promoted is None:
                    self.promoted = (cohort, view.state_entered)
                if cohort == self.failed and view.state == "standby" and self.parked is None:
                    self.parked = view.state_entered
            self.stop.wait(0.02)


def inject(job: dict[str, Any], step_id: str, fault: str, at: float, python: str,
           timeout: float) -> list[dict[str, Any]]:
    """Run the fault task on every node of the job (srun --jobid --overlap); one report per node."""
    spec = FAULTS[fault]
    nodes = job["nodes"]
    target = nodes[0] if spec.node == "leader" or len(nodes) == 1 else nodes[-1]
    rank = 0 if target is nodes[0] else len(nodes) - 1
    argv = ["srun", f"--jobid={job['job_id']}", "--overlap", f"--nodes={len(nodes)}", "--ntasks-per-node=1",
            "--job-name=drill", "--label", python, "-m", "shadowline.drill.slurm_fault", "--step", step_id,
            "--target-node", target["name"], "--rank", str(rank), "--fault", spec.slurm, "--at", f"{at:.3f}",
            "--timeout", f"{timeout:g}"]
    env = dict(os.environ)
    if job.get("library_dir"):  # the job imports shadowline from there (gms_slurm.library_dir): so does its task
        env["PYTHONPATH"] = job["library_dir"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if fault == "scancel-step":
        time.sleep(max(0.0, at - time.time()))
        subprocess.run(["scancel", step_id], check=False, timeout=30)
    out, _unused = proc.communicate(timeout=timeout + 60)
    reports = []
    for line in out.splitlines():
        text = line.split(":", 1)[1].strip() if line[:1].isdigit() and ":" in line else line.strip()
        if text.startswith("{"):
            reports.append(json.loads(text))
    if len(reports) != len(nodes):
        raise DrillError(f"the fault task did not report from every node: {out[-2000:]}")
    return reports


@dataclass(frozen=True)
class Observed:
    """What a Slurm drill gathered, the inputs of its report."""
    fault: str
    job_id: str
    failed_cohort: int
    step_id: str
    fault_at: float  # when the fault task hit (unix time)
    nodes: list[dict[str, Any]]  # the fault task's report of every node (drill/slurm_fault.py)
    promoted: tuple[int, float] | None  # (the cohort, when its leader entered active)
    parked: float | None  # when the failed slot's fresh shadow entered standby
    requests: list[dict[str, Any]]  # the load's records (common.frontend.Request.to_dict)
    events: list[dict[str, Any]]  # the supervisor's events since the fault
    shadows: list[int]  # the cohorts parked before the fault
    registrations: list[dict[str, Any]]  # discovery registrations beyond the new primary's (or why not checked)


def drill(job_dir: str, fault: str, rate: float = 20.0, timeout: float = 60.0, settle: float = 1.0) -> dict[str, Any]:
    if fault not in FAULTS:
        raise DrillError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    job = load_job(job_dir)
    plan = Plan.from_dict(job["plan"])
    failed = active_cohort(plan)
    shadows = parked_cohorts(plan)
    if not shadows:
        raise DrillError("no shadow is parked: a failover now would have nothing to promote")
    step_id = next((s["step_id"] for s in reversed(job["steps"].get(f"cohort_{failed}", []))
                    if s["step_id"] and s["ended"] is None), None)
    if not step_id:
        raise DrillError(f"job.json has no running step of cohort {failed}")
    python = job.get("python") or plan.python  # the supervisor's interpreter, else the runtime's
    load = Load(job["frontend_url"], plan.model_id, rate=rate, timeout=10.0).start()
    time.sleep(settle)
    at = time.time() + 1.5  # every node's fault task lists the step's processes before this
    watcher = Watcher(plan, failed, at)
    watcher.start()
    reports = inject(job, step_id, fault, at, python, timeout)
    fault_at = next((r["fault_at"] for r in reports if r.get("fault_at")), at)
    deadline = time.monotonic() + timeout
    while (watcher.promoted is None or watcher.parked is None) and time.monotonic() < deadline:
        time.sleep(0.05)
    watcher.stop.set()
    time.sleep(settle)
    requests = load.stop()
    events = supervisor_events(os.path.join(job_dir, "events.jsonl"), fault_at - 0.5,
                               max(deadline, time.monotonic() + 10.0))
    return report(Observed(fault=fault, job_id=job["job_id"], failed_cohort=failed, step_id=step_id,
                           fault_at=fault_at, nodes=reports, promoted=watcher.promoted, parked=watcher.parked,
                           requests=[r.to_dict() for r in requests], events=events, shadows=shadows,
                           registrations=extra_registrations(plan)))


def supervisor_events(path: str, since: float, deadline: float) -> list[dict[str, Any]]:
    """The supervisor's events since the fault, once it has recorded the promotion and the parked relaunch (it
    writes them after it observed them, which on a loaded machine can be after the drill's own watcher saw
    them); whatever it has at ``deadline`` (monotonic) otherwise."""
    while True:
        events = list(read_events(path, since))
        if {"promoted", "parked"} <= {e["event"] for e in events} or time.monotonic() >= deadline:
            return events
        time.sleep(0.1)


def extra_registrations(plan: Plan) -> list[dict[str, Any]]:
    """Discovery registrations of the model beyond the new primary's: orphans (or why they were not checked); an
    operator's read, at the operator's patience (cluster/access.operator_etcd), as the systemd drills read."""
    try:
        regs = [r for r in discovery.registrations(operator_etcd(plan))
                if r.model_name in (None, plan.model_id)]
    except EtcdError as err:
        return [{"discovery": f"not checked: {err}"}]
    return [{"registration": r.instance_id, "address": r.request_address} for r in regs[1:]]


def detected_at(o: Observed, target_node: str | None, teardown: float | None) -> float | None:
    """When the system reacted: the watchdog's detection of a hang, Slurm's first kill of a surviving process
    of the step after a kill, the fault itself for a step the drill cancelled."""
    action = FAULTS[o.fault].slurm
    if action == "stop":
        detections = [e["detail"].get("detected") or e["time"] for e in o.events
                      if e["event"] in ("watchdog-hang-detected",) and e["detail"].get("step_id") == o.step_id]
        return min(detections) if detections else None
    if action == "none":
        return o.fault_at
    others = [r["first_gone"] for r in o.nodes if r["node"] != target_node and r["first_gone"]]
    return min(others) if others else (teardown if len(o.nodes) == 1 else None)


def report(o: Observed) -> dict[str, Any]:
    """The Slurm drill's report (module docstring): the request figures are drill/outage.py's, as the agents'
    drill report's."""
    def since(t: float | None) -> float | None:
        return rel(t, o.fault_at)

    target_node = next((r["node"] for r in o.nodes if r.get("target")), None)
    gone = [r["all_gone"] for r in o.nodes]
    teardown = max(gone) if all(gone) else None
    detected = detected_at(o, target_node, teardown)
    promoted = o.promoted[1] if o.promoted else None
    seen = outage(o.requests, o.fault_at)
    before, after = seen.split(promoted)
    relaunched = next((e["time"] for e in o.events if e["event"] == "relaunched" and e["cohort"] == o.failed_cohort),
                      None)
    orphans: list[Any] = [{"node": r["node"], **left} for r in o.nodes for left in r["left"]]
    return {
        "fault": o.fault, "job_id": o.job_id, "failed_cohort": o.failed_cohort, "failed_step": o.step_id,
        "target_node": target_node, "shadows_parked": o.shadows,
        "promoted_cohort": o.promoted[0] if o.promoted else None,
        "fault_at": round(o.fault_at, 3),
        "detect_s": since(detected), "teardown_s": since(teardown), "promote_s": since(promoted),
        "first_ok_s": since(seen.first_ok["end"]) if seen.first_ok else None,
        "failed_before_promotion": before, "failed_after_promotion": after,
        "requests_after_fault": len(seen.after_fault), "requests": len(o.requests),
        "failures": [{"sent_s": since(r["start"]), "ended_s": since(r["end"]), "status": r["status"],
                      "error": r["error"][:120]} for r in seen.failed[:30]],
        "orphans": orphans + o.registrations,
        "relaunch_started_s": since(relaunched), "relaunch_s": since(o.parked),
        "nodes": o.nodes,
        "events": [{**{k: e[k] for k in ("time", "node", "cohort", "generation", "event")}, "detail": e["detail"]}
                   for e in o.events],
    }
