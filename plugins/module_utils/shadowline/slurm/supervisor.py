"""The batch supervisor: ``python -m shadowline.slurm.supervisor SCRIPT``, the last command of the batch script.

Read top to bottom, ``Supervisor.run``:

1. reads the allocation (``scontrol show hostnames``, node addresses), exports ``SL_NODE_<i>``/``SL_ADDR_<i>``,
   makes the job directory and starts ``job.json`` and ``events.jsonl`` there;
2. prepares every node (a fresh node directory; the script copied there with ``sbcast``); unless
   ``gms_insecure``, makes the job's own credentials and installs each node's share (slurm/job_secrets.py);
3. checks that the pinned model is staged and identical on every node (the model library's readiness gate);
4. starts the GMS servers, etcd (then turns its authentication on), NATS and the frontend, waiting for each;
5. starts the primary cohort and waits until it serves, then the shadows until each is parked;
6. watches: when a cohort step ends (a rank died; the watchdog ended a hung one; ``scancel <job>.<step>``) it
   revokes that cohort's discovery registration and relaunches the step as a fresh shadow in the same slot,
   after a delay that starts at ``gms_failover.relaunch_backoff_s`` and doubles with each failure in a row (a
   slot that fails ``max_relaunch_attempts`` times in a row without parking is given up); a serving cohort's
   relaunch waits until the promoted shadow serves (at most 5 s), so the two do not compete for CPU;
   promotions and states are logged;
7. on SIGTERM/SIGINT (``scancel`` of the job, or ``--signal=B:TERM@<lead>`` before the time limit) stops the
   shadows, then the serving cohort, the frontend, NATS, etcd and the GMS servers, and removes the node
   directories.

Every step is the script's own ``step_<name>`` function (``bash SCRIPT step <name>``), so what runs is what the
script shows. Steps' output goes to ``steps/<name>.<generation>.log``; the watchdog's ``SHADOWLINE_EVENT`` lines
are copied into the event log.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..cluster import discovery
from ..cluster.access import ensure_etcd_auth, etcd_context, etcd_for
from ..cluster.cohort_state import leader_state
from ..cluster.waits import http_check, listening_check, poll
from ..common import console
from ..common.etcd_client import EtcdError
from ..common.events import EventLog
from ..common.frontend import complete
from ..common.policy import RelaunchPolicy
from ..deployment.plan import Plan
from ..model.fsutil import atomic_write_json
from ..model.readiness import readiness_gate
from .allocation import AllocationError, Node, allocation, concrete, read_spec
from .job_secrets import BUNDLE, make_bundle
from .options import SlurmOptions
from .watchdog import EVENT_PREFIX

PARKED, ACTIVE = "standby", "active"
LOOP_INTERVAL = 0.05
PROMOTION_WAIT = 5.0  # seconds a serving cohort's relaunch waits for the promoted shadow to serve (CPU goes to it)
OBSERVE_INTERVAL = 0.1


class Fatal(Exception):
    """The job cannot run: recorded, then everything is stopped and the supervisor exits 1."""


class Stopping(Exception):
    """A stop was asked for (signal) while starting up."""


@dataclass
class Step:
    name: str  # the script's step name: gms, etcd, cohort_0, ...
    generation: int
    popen: subprocess.Popen
    log_path: str
    started: float = field(default_factory=time.time)
    step_id: str | None = None
    lines: list[str] = field(default_factory=list)
    reached: str | None = None  # the furthest failover state its leader reached: standby or active
    hang: str | None = None  # why the watchdog ended it, if it did
    ended: float | None = None

    @property
    def cohort(self) -> int | None:
        return int(self.name.split("_", 1)[1]) if self.name.startswith("cohort_") else None

    def record(self) -> dict[str, Any]:
        return {"generation": self.generation, "step_id": self.step_id, "started": round(self.started, 3),
                "ended": round(self.ended, 3) if self.ended else None, "exit": self.popen.poll(),
                "reached": self.reached, "log": self.log_path}


@dataclass
class StepSlot:
    """One relaunchable step (a cohort or an infra process) and its crash-loop bookkeeping."""
    name: str
    step: Step | None = None
    generation: int = 0
    failures: int = 0  # ends in a row, counting the last healthy one (1): relaunch delay and give-up count
    due: float | None = None  # when to relaunch
    last_end: float | None = None
    given_up: bool = False
    after_promotion: bool = False  # it was serving: relaunch once a shadow serves (or PROMOTION_WAIT passed)
    history: list[Step] = field(default_factory=list)


class Supervisor:
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
        self.stop_reason: str | None = None
        self.queue: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.slots: dict[str, StepSlot] = {}
        self.states: dict[int, str | None] = {}
        self.owner: dict[int, int] = {}  # discovery lease -> cohort that registered it
        self.serving: int | None = None
        self.last_served: int | None = None
        self.awaiting_serving = False  # a serving cohort ended; its relaunch waits until a shadow serves
        self.known_step_ids: set[str] = set()
        self.nodes: list[Node] = []
        self.plan: Plan | None = None  # the spec's plan with the allocation's addresses (once known)
        self.passwords: dict[str, str] = {}  # the job's etcd passwords by user (job_secrets); never printed
        self.exit_code = 0
        self.job_lock = threading.Lock()
        self.started = time.time()

    # -- the job, top to bottom ------------------------------------------------------------------------ #

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        try:
            self.start_job()
            self.prepare_nodes()
            self.install_secrets()
            self.check_model()
            self.start_infra()
            self.start_cohorts()
            threading.Thread(target=self.observe, name="observer", daemon=True).start()
            while self.stop_reason is None:
                self.handle_messages()
                self.collect_ended_steps()
                self.relaunch_due()
                time.sleep(LOOP_INTERVAL)
        except Fatal as err:
            self.exit_code = 1
            self.stop_reason = self.stop_reason or "fatal"
            self.events.write("fatal", error=str(err))
            console.err(f"shadowline: {err}")
        except Stopping:
            pass
        self.shutdown()
        return self.exit_code

    def on_signal(self, signum: int, _frame: Any) -> None:
        if self.stop_reason is None:
            self.stop_reason = signal.Signals(signum).name

    def start_job(self) -> None:
        try:
            self.nodes = allocation(os.environ.get("SLURM_JOB_NODELIST", self.host))
        except AllocationError as err:
            raise SystemExit(f"shadowline: {err}") from None
        name = os.environ.get("SLURM_JOB_NAME", "shadowline")
        output_dir = os.environ.get("SL_OUTPUT_DIR") or os.environ.get("SLURM_SUBMIT_DIR") or os.getcwd()
        self.job_dir = os.path.join(output_dir, f"{name}-{self.job_id}")
        os.makedirs(os.path.join(self.job_dir, "steps"), exist_ok=True)
        self.events = EventLog(os.path.join(self.job_dir, "events.jsonl"), self.host, echo=True, mode=0o644,
                               deployment=self.spec_plan.deployment)
        console.out(f"shadowline: job directory {self.job_dir}", flush=True)
        self.export_nodes()
        expected = len(self.spec_plan.nodes)
        self.events.write("job-started", job_id=self.job_id, nodes=[n.name for n in self.nodes],
                          addresses=[n.address for n in self.nodes], script=self.script, pid=os.getpid())
        if len(self.nodes) != expected:
            raise Fatal(f"the allocation has {len(self.nodes)} node(s) but the deployment needs {expected} "
                        "(gms_engine.nnodes): submit with --nodes unchanged from the rendered script")

    def export_nodes(self) -> None:
        for i, node in enumerate(self.nodes):
            os.environ[f"SL_NODE_{i}"] = node.name
            os.environ[f"SL_ADDR_{i}"] = node.address
        os.environ["SL_JOB_DIR"] = self.job_dir
        self.plan = Plan.from_dict(concrete(self.spec_plan.to_dict(), self.nodes))
        self.write_job()

    def prepare_nodes(self) -> None:
        step = self.run_to_end("prepare", 120)
        order = {}
        for line in step.lines:
            words = line.split(":", 1)[-1].split()
            if len(words) == 2 and words[0].isdigit():
                order[int(words[0])] = words[1]
        if sorted(order) != list(range(len(self.nodes))):
            raise Fatal(f"prepare did not report every node: {step.lines[-5:]}")
        if [order[i] for i in sorted(order)] != [n.name for n in self.nodes]:
            by_name = {n.name: n for n in self.nodes}
            self.nodes = [by_name[order[i]] for i in sorted(order)]  # rank = SLURM_NODEID of all-node steps
            self.export_nodes()
            self.events.write("node-order", nodes=[n.name for n in self.nodes])
        target = os.path.join(self.options.node_dir, "job.sh")
        self.sbcast(self.script, target)
        self.events.write("nodes-prepared", node_dir=self.options.node_dir, script_copy=target)

    def sbcast(self, source: str, target: str) -> None:
        proc = subprocess.run(["sbcast", "--force", source, target], capture_output=True, text=True,
                              timeout=120, check=False)
        if proc.returncode != 0:
            raise Fatal(f"sbcast of {source} to {target} failed: {proc.stderr.strip()}")

    def install_secrets(self) -> None:
        """Unless gms_insecure: the job's own credentials on every node (slurm/job_secrets.py), before anything
        that uses them starts; then the supervisor's etcd client, as the agents' identity."""
        plan = self.job_plan
        if plan.secure and plan.security is not None:
            scratch = tempfile.mkdtemp(prefix="shadowline-bundle-")
            try:
                bundle = os.path.join(scratch, BUNDLE)
                self.passwords = make_bundle(plan, bundle)
                self.sbcast(bundle, os.path.join(self.options.node_dir, BUNDLE))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            if self.run_to_end("secrets", 60).popen.returncode != 0:
                raise Fatal("the job's credentials could not be installed on every node (see steps/secrets.1.log)")
            self.events.write("secrets-installed", directory=plan.security.dir)
        self.etcd = etcd_for(plan, timeout=1.0)

    @property
    def job_plan(self) -> Plan:
        """The concrete plan; known from start_job on (before it, nothing reads it)."""
        if self.plan is None:
            raise Fatal("the plan is not known before the allocation is read")
        return self.plan

    def check_model(self) -> None:
        if not self.options.model_check:
            return
        step = self.run_to_end("model_check", 300)
        statuses: dict[str, Any] = {}
        notes = []
        for line in step.lines:
            text = line.split(":", 1)[-1].strip() if line[:1].isdigit() else line.strip()
            if not text.startswith("{"):
                continue
            report = _json(text)
            statuses[report.get("node", "?")] = report.get("status")
            if report.get("problem"):
                notes.append(f"{report.get('node')}: {report['problem']}")
        for node in self.nodes:
            statuses.setdefault(node.name, None)
        plan = self.job_plan
        problems = readiness_gate(statuses, expected_revision=plan.revision, expected_model_id=plan.model_id)
        if problems:
            self.events.write("model-not-ready", problems=problems, notes=notes)
            raise Fatal("the model is not ready on every node: " + " ".join(problems + notes))
        digests = sorted({s["digest"] for s in statuses.values() if s})
        self.events.write("model-ready", model=plan.model_id, revision=plan.revision, digest=digests[0])

    def start_infra(self) -> None:
        timeout = self.options.ready_timeout_s
        self.launch("gms")
        if self.run_to_end("gms_wait", timeout).popen.returncode != 0:
            raise Fatal("a GMS server did not come up (see steps/gms_wait.1.log and steps/gms.1.log)")
        infra = self.job_plan.infra
        if infra.etcd_proxies:  # Dynamo's processes reach etcd's TLS through it (slurm/etcd_proxy.py)
            self.launch("etcd_proxy")
            if self.run_to_end("etcd_proxy_wait", 60).popen.returncode != 0:
                raise Fatal("an etcd proxy did not come up (see steps/etcd_proxy_wait.1.log, steps/etcd_proxy.1.log)")
        self.launch("etcd")
        endpoint = infra.etcd_endpoints.split(",")[0]
        try:
            context = etcd_context(self.job_plan)
        except EtcdError as err:
            raise Fatal(str(err)) from None
        self.wait_ready("etcd", http_check(endpoint + "/health", context=context), 60)
        if self.passwords:
            try:
                changed = ensure_etcd_auth(endpoint, self.job_plan.deployment, self.passwords, context=context)
            except EtcdError as err:
                raise Fatal(f"could not turn on etcd's authentication: {err}") from None
            self.events.write("etcd-authentication", changed=changed)
        self.launch("nats")
        host, port = infra.nats_server.split(",")[0].split("://")[-1].rsplit(":", 1)
        self.wait_ready("nats", listening_check(host, [int(port)]), 60)
        self.launch("frontend")
        self.wait_ready("frontend", http_check(infra.frontend_url + "/health"), timeout)

    def start_cohorts(self) -> None:
        timeout = self.options.ready_timeout_s
        cohorts = self.job_plan.cohort_ids
        self.launch(f"cohort_{cohorts[0]}")
        self.wait_state(cohorts[0], ACTIVE, timeout)
        self.serving = cohorts[0]
        self.attribute_leases(cohorts[0])
        for cohort in cohorts[1:]:
            self.launch(f"cohort_{cohort}")
        for cohort in cohorts[1:]:
            self.wait_state(cohort, PARKED, timeout)
        started = time.monotonic()
        ready, waited, seen = poll(self.completion_check, 60, 0.1)
        if not ready:
            raise Fatal(f"no completion through the frontend within 60 s: {seen}")
        self.events.write("deployment-ready", cohort=cohorts[0], frontend=self.job_plan.infra.frontend_url,
                          first_completion_s=round(time.monotonic() - started, 3),
                          since_job_start_s=round(time.time() - self.started, 3))

    # -- watching -------------------------------------------------------------------------------------- #

    def observe(self) -> None:
        """Background: each cohort leader's failover state and discovery's leases, as messages to the loop."""
        last: dict[int, str | None] = dict(self.states)
        next_leases = 0.0
        plan = self.job_plan
        while self.stop_reason is None:
            for cohort in plan.cohort_ids:
                state = leader_state(plan, cohort, timeout=0.3)
                if state != last.get(cohort):
                    self.queue.put(("state", cohort, last.get(cohort), state, time.time()))
                    last[cohort] = state
            if time.monotonic() >= next_leases:
                next_leases = time.monotonic() + 0.25
                try:
                    self.queue.put(("leases", discovery.registrations(self.etcd)))
                except EtcdError:
                    pass
            time.sleep(OBSERVE_INTERVAL)

    def handle_messages(self) -> None:
        while True:
            try:
                message = self.queue.get_nowait()
            except queue.Empty:
                return
            kind = message[0]
            if kind == "state":
                self.on_state(*message[1:])
            elif kind == "leases":
                self.on_leases(message[1])
            elif kind == "task-event":
                self.on_task_event(*message[1:])

    def on_state(self, cohort: int, before: str | None, after: str | None, when: float) -> None:
        self.states[cohort] = after
        slot = self.slots.get(f"cohort_{cohort}")
        step = slot.step if slot else None
        if after is None:
            return
        generation = step.generation if step else None
        self.events.write("state", cohort=cohort, generation=generation, when=when, before=before, after=after)
        if step and after in (PARKED, ACTIVE):
            if step.reached != ACTIVE:
                step.reached = after
            slot.failures = 0
            if after == PARKED and slot.last_end is not None and generation and generation > 1:
                self.events.write("parked", cohort=cohort, generation=generation, when=when,
                                  since_end_s=round(when - slot.last_end, 3), step_id=step.step_id)
        if after == ACTIVE and self.serving != cohort:
            previous = self.serving if self.serving is not None else self.last_served
            self.serving = cohort
            self.events.write("promoted", cohort=cohort, generation=generation, when=when, previous=previous,
                              step_id=step.step_id if step else None)
            threading.Thread(target=self.report_serving, args=(cohort, generation, when), daemon=True).start()

    def report_serving(self, cohort: int, generation: int | None, promoted: float) -> None:
        ready, _unused, seen = poll(self.completion_check, 30, 0.05)
        if ready:
            self.awaiting_serving = False
            self.events.write("serving", cohort=cohort, generation=generation,
                              since_promotion_s=round(time.time() - promoted, 3))
        else:
            self.events.write("not-serving", cohort=cohort, generation=generation, last=seen)

    def completion_check(self) -> str | None:
        status, text = complete(self.job_plan.infra.frontend_url, self.job_plan.model_id, timeout=5)
        return None if status == 200 else f"HTTP {status}: {text[:120]}"

    def on_leases(self, registrations: list[discovery.Registration]) -> None:
        """Attribute each new lease to the cohort that registered it: by the exact match (a real engine's card
        names its cohort's system port), else to the one cohort that is waking or serving right now. While that
        is ambiguous (in a failover, before the old primary is seen gone) the lease waits: revoking a lease of
        the wrong cohort would fence the new primary."""
        plan = self.job_plan
        for reg in registrations:
            if reg.lease in self.owner or (reg.model_name and reg.model_name != plan.model_id):
                continue
            exact = [c.cohort for c in plan.cohorts if reg.system_address == f"{c.leader.address}:{c.ports.system}"]
            live = [c for c, state in self.states.items() if state in ("waking", ACTIVE) and self.running(c)]
            owner = exact[0] if exact else (live[0] if len(live) == 1 else None)
            if owner is None:
                continue
            self.owner[reg.lease] = owner
            slot = self.slots.get(f"cohort_{owner}")
            self.events.write("registered", cohort=owner, generation=slot.generation if slot else None,
                              lease=reg.instance_id, request_address=reg.request_address)

    def running(self, cohort: int) -> bool:
        slot = self.slots.get(f"cohort_{cohort}")
        return bool(slot and slot.step and slot.step.ended is None and slot.step.popen.poll() is None)

    def attribute_leases(self, cohort: int) -> None:
        try:
            regs = discovery.registrations(self.etcd)
        except EtcdError:
            return
        for reg in regs:
            if reg.host == self.job_plan.cohort(cohort).leader.address and reg.lease not in self.owner:
                self.owner[reg.lease] = cohort

    def on_task_event(self, step: Step, record: dict[str, Any]) -> None:
        detail = dict(record.get("detail") or {})
        if record.get("step"):
            detail["step_id"] = record["step"]
            if step.step_id is None:
                step.step_id = record["step"]
        detail["rank"] = record.get("rank")
        if record.get("event") == "hang-detected":
            step.hang = detail.get("reason")
        self.events.write(f"watchdog-{record.get('event')}", cohort=step.cohort, generation=step.generation,
                          node=record.get("node"), when=record.get("time"), **detail)

    def collect_ended_steps(self) -> None:
        for slot in self.slots.values():
            step = slot.step
            if step is None or step.ended is not None or step.popen.poll() is None:
                continue
            step.ended = time.time()
            slot.last_end = step.ended
            self.handle_messages()  # the watchdog's last words, if any
            cohort = step.cohort
            self.events.write("step-ended", cohort=cohort, generation=step.generation, step=step.name,
                              step_id=step.step_id, exit=step.popen.returncode,
                              ran_s=round(step.ended - step.started, 3),
                              reached=step.reached, hang=step.hang)
            slot.after_promotion = False
            if cohort is not None:
                self.revoke(cohort, step)
                if self.serving == cohort:
                    self.serving, self.last_served = None, cohort
                    slot.after_promotion = any(s in (PARKED, "waking", ACTIVE) for c, s in self.states.items()
                                               if c != cohort)
                    self.awaiting_serving = slot.after_promotion
            healthy = step.reached or not self.relaunch.quick(step.ended - step.started)
            slot.failures = 1 if healthy else slot.failures + 1
            if self.relaunch.gives_up(slot.failures):
                slot.given_up = True
                self.events.write("gave-up", cohort=cohort, generation=step.generation, step=step.name,
                                  failures=slot.failures - 1)
                continue
            delay = self.relaunch.delay(slot.failures)
            slot.due = time.monotonic() + delay
            self.events.write("relaunch-scheduled", cohort=cohort, generation=step.generation + 1, step=step.name,
                              delay_s=round(delay, 3), failures_in_a_row=slot.failures)
            self.write_job()
        if self.slots and all(s.given_up for n, s in self.slots.items() if n.startswith("cohort_")):
            raise Fatal("every cohort was given up after repeated failures")

    def revoke(self, cohort: int, step: Step) -> None:
        """Fence the dead cohort in discovery: its leases (seen when it registered, or matched exactly) go at once."""
        started = time.time()
        leases = {lease for lease, owner in self.owner.items() if owner == cohort}
        try:
            leases |= {r.lease for r in discovery.cohort_registrations(self.etcd, self.job_plan, cohort)}
            current = {r.lease for r in discovery.registrations(self.etcd)}
            revoked = discovery.revoke_leases(self.etcd, sorted(leases & current))
        except EtcdError as err:
            self.events.write("revoke-failed", cohort=cohort, generation=step.generation, error=str(err))
            return
        for lease in leases:
            self.owner.pop(lease, None)
        if revoked:
            self.events.write("revoked", cohort=cohort, generation=step.generation,
                              leases=[f"{lease:x}" for lease in revoked], revoke_s=round(time.time() - started, 3))

    def relaunch_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots.values():
            if slot.due is None or now < slot.due or slot.given_up:
                continue
            if slot.after_promotion and self.awaiting_serving and now < slot.due + PROMOTION_WAIT:
                continue  # the failover first: a booting shadow would compete for CPU with the promotion
            slot.due = None
            since = time.time() - slot.last_end if slot.last_end else None
            step = self.launch(slot.name)
            self.events.write("relaunched", cohort=step.cohort, generation=step.generation, step=slot.name,
                              since_end_s=round(since, 3) if since is not None else None)

    # -- steps ----------------------------------------------------------------------------------------- #

    def launch(self, name: str) -> Step:
        slot = self.slots.setdefault(name, StepSlot(name))
        slot.generation += 1
        log_path = os.path.join(self.job_dir, "steps", f"{name}.{slot.generation}.log")
        popen = subprocess.Popen(["bash", self.script, "step", name], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, errors="replace",
                                 start_new_session=True)
        step = Step(name, slot.generation, popen, log_path)
        slot.step = step
        slot.history.append(step)
        threading.Thread(target=self.read_output, args=(step,), name=f"out-{name}", daemon=True).start()
        threading.Thread(target=self.find_step_id, args=(step,), name=f"id-{name}", daemon=True).start()
        cohort = step.cohort
        self.events.write("step-launched", cohort=cohort, generation=step.generation, step=name, pid=popen.pid)
        return step

    def read_output(self, step: Step) -> None:
        with open(step.log_path, "a", encoding="utf-8") as log:
            for line in step.popen.stdout:  # type: ignore[union-attr]
                log.write(line)
                log.flush()
                step.lines.append(line.rstrip("\n"))
                if EVENT_PREFIX in line:
                    record = _json(line.split(EVENT_PREFIX, 1)[1])
                    if record:
                        self.queue.put(("task-event", step, record))

    def find_step_id(self, step: Step) -> None:
        """The step's id (job.step) from squeue, by its name, among the steps not seen before."""
        slurm_name = step.name.replace("_", "-")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and step.step_id is None and step.popen.poll() is None:
            out = subprocess.run(["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i %j"], capture_output=True,
                                 text=True, timeout=10, check=False).stdout
            for line in out.splitlines():
                words = line.split()
                if len(words) == 2 and words[1] == slurm_name and words[0] not in self.known_step_ids:
                    step.step_id = words[0]
                    break
            time.sleep(0.05)
        if step.step_id:
            self.known_step_ids.add(step.step_id)
            self.write_job()

    def run_to_end(self, name: str, timeout: float, stoppable: bool = True) -> Step:
        step = self.launch(name)
        deadline = time.monotonic() + timeout
        while step.popen.poll() is None:
            if stoppable and self.stop_reason is not None:
                step.popen.kill()
                raise Stopping
            if time.monotonic() > deadline:
                step.popen.kill()
                raise Fatal(f"step {name} did not finish within {timeout:g} s (see {step.log_path})")
            time.sleep(LOOP_INTERVAL)
        step.ended = time.time()
        time.sleep(0.1)  # let the reader drain
        self.events.write("step-ended", step=name, step_id=step.step_id, exit=step.popen.returncode,
                          ran_s=round(step.ended - step.started, 3))
        if step.popen.returncode != 0 and name != "gms_wait":
            raise Fatal(f"step {name} failed with status {step.popen.returncode}: {' | '.join(step.lines[-5:])}")
        return step

    def wait_ready(self, name: str, check: Any, timeout: float) -> None:
        step = self.slots[name].step
        started = time.monotonic()
        while True:
            if self.stop_reason is not None:
                raise Stopping
            problem = check()
            if problem is None:
                self.events.write("ready", step=name, step_id=step.step_id if step else None,
                                  after_s=round(time.monotonic() - started, 3))
                return
            if step is not None and step.popen.poll() is not None:
                raise Fatal(f"{name} ended with status {step.popen.returncode} before it was ready: "
                            f"{' | '.join(step.lines[-5:])}")
            if time.monotonic() - started > timeout:
                raise Fatal(f"{name} not ready after {timeout:g} s: {problem}")
            time.sleep(0.1)

    def wait_state(self, cohort: int, state: str, timeout: float) -> None:
        def check() -> str | None:
            current = leader_state(self.job_plan, cohort, timeout=0.5)
            if current == state or (state == PARKED and current == ACTIVE):
                self.on_state(cohort, self.states.get(cohort), current, time.time())
                return None
            return f"cohort {cohort}'s leader is {current or 'not answering'}"
        self.wait_ready(f"cohort_{cohort}", check, timeout)

    # -- stopping -------------------------------------------------------------------------------------- #

    def shutdown(self) -> None:
        reason = self.stop_reason or "done"
        self.stop_reason = reason
        self.events.write("shutdown", reason=reason)
        cohorts = [f"cohort_{c}" for c in (self.plan.cohort_ids if self.plan else [])]
        serving = f"cohort_{self.serving}" if self.serving is not None else None
        order = [[n for n in cohorts if n != serving], [serving] if serving else [], ["frontend"], ["nats"],
                 ["etcd"], ["gms", "etcd_proxy"]]
        grace = float(self.options.stop_grace_s) + 2
        for group in order:
            self.stop_steps([self.slots[n].step for n in group if n in self.slots and self.slots[n].step], grace)
        if self.slots:
            try:
                self.run_to_end("cleanup", 30, stoppable=False)
            except (Fatal, Stopping):
                pass
        self.write_job(state="stopped")
        self.events.write("stopped", exit=self.exit_code)

    def stop_steps(self, steps: list[Step | None], grace: float) -> None:
        running = [s for s in steps if s is not None and s.popen.poll() is None]
        for step in running:
            # Cohort ranks stop in order on SIGINT (their watchdog kills at once on SIGTERM); the rest on SIGTERM.
            sig = "INT" if step.cohort is not None else "TERM"
            if step.step_id:
                subprocess.run(["scancel", f"--signal={sig}", step.step_id], capture_output=True, timeout=10,
                               check=False)
            else:
                step.popen.terminate()
        deadline = time.monotonic() + grace
        while any(s.popen.poll() is None for s in running) and time.monotonic() < deadline:
            time.sleep(LOOP_INTERVAL)
        for step in running:
            if step.popen.poll() is None:
                if step.step_id:
                    subprocess.run(["scancel", step.step_id], capture_output=True, timeout=10, check=False)
                else:
                    step.popen.kill()
        for step in running:
            try:
                step.popen.wait(15)
            except subprocess.TimeoutExpired:
                step.popen.kill()
            step.ended = step.ended or time.time()
            self.events.write("step-stopped", cohort=step.cohort, generation=step.generation, step=step.name,
                              step_id=step.step_id, exit=step.popen.returncode)

    def write_job(self, state: str = "running") -> None:
        with self.job_lock:
            self._write_job(state)

    def _write_job(self, state: str) -> None:
        atomic_write_json(os.path.join(self.job_dir, "job.json"), {
            "job_id": self.job_id, "job_name": os.environ.get("SLURM_JOB_NAME"), "state": state,
            "batch_host": self.host, "script": self.script, "job_dir": self.job_dir,
            "nodes": [{"name": n.name, "address": n.address} for n in self.nodes],
            "frontend_url": self.plan.infra.frontend_url if self.plan else None,
            "model_id": self.plan.model_id if self.plan else None,
            "serving": self.serving, "node_dir": self.options.node_dir, "python": sys.executable,
            "steps": {name: [s.record() for s in slot.history] for name, slot in self.slots.items()},
            "plan": self.plan.to_dict() if self.plan else {},
        }, durable=False)


def _json(text: str) -> dict[str, Any]:
    import json
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        console.err("usage: python -m shadowline.slurm.supervisor BATCH_SCRIPT (run by the rendered batch script)")
        return 2
    return Supervisor(args[0]).run()


if __name__ == "__main__":
    raise SystemExit(main())
