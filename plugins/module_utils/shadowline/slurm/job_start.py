"""The job's start, in the order Supervisor.run calls it: the allocation and the job directory, the nodes
prepared, the job's credentials, the model checked, the infra processes, the cohorts. Each part raises Fatal
when the job cannot run, Stopping when a stop was asked for meanwhile."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

from ..cluster.access import ensure_etcd_auth, etcd_context, etcd_for
from ..cluster.cohort_state import leader_state
from ..cluster.waits import http_check, listening_check, poll
from ..common import console
from ..common.etcd_client import EtcdError
from ..common.events import EventLog
from ..deployment.plan import Plan
from ..model.readiness import readiness_gate
from .allocation import AllocationError, allocation, concrete
from .job_secrets import BUNDLE, make_bundle
from .job_state import Fatal, JobState
from .slots import ACTIVE, PARKED
from .steps import StepRunner, json_object
from .watch import Watch, completion_problem


class JobStart:
    def __init__(self, job: JobState, steps: StepRunner, watch: Watch) -> None:
        self.job = job
        self.steps = steps
        self.watch = watch
        self.passwords: dict[str, str] = {}  # the job's etcd passwords by user (job_secrets); never printed

    def start_job(self) -> None:
        """The allocation's nodes, the job directory with ``events.jsonl`` and ``job.json``."""
        job = self.job
        try:
            job.nodes = allocation(os.environ.get("SLURM_JOB_NODELIST", job.host))
        except AllocationError as err:
            raise SystemExit(f"shadowline: {err}") from None
        name = os.environ.get("SLURM_JOB_NAME", "shadowline")
        output_dir = os.environ.get("SL_OUTPUT_DIR") or os.environ.get("SLURM_SUBMIT_DIR") or os.getcwd()
        job.job_dir = os.path.join(output_dir, f"{name}-{job.job_id}")
        os.makedirs(os.path.join(job.job_dir, "steps"), exist_ok=True)
        job.events = EventLog(os.path.join(job.job_dir, "events.jsonl"), job.host, echo=True, mode=0o644,
                              deployment=job.spec_plan.deployment)
        console.out(f"shadowline: job directory {job.job_dir}", flush=True)
        self.export_nodes()
        expected = len(job.spec_plan.nodes)
        job.events.write("job-started", job_id=job.job_id, nodes=[n.name for n in job.nodes],
                         addresses=[n.address for n in job.nodes], script=job.script, pid=os.getpid())
        if len(job.nodes) != expected:
            raise Fatal(f"the allocation has {len(job.nodes)} node(s) but the deployment needs {expected} "
                        "(gms_engine.nnodes): submit with --nodes unchanged from the rendered script")

    def export_nodes(self) -> None:
        job = self.job
        for i, node in enumerate(job.nodes):
            os.environ[f"SL_NODE_{i}"] = node.name
            os.environ[f"SL_ADDR_{i}"] = node.address
        os.environ["SL_JOB_DIR"] = job.job_dir
        job.plan = Plan.from_dict(concrete(job.spec_plan.to_dict(), job.nodes))
        job.write_job()

    def prepare_nodes(self) -> None:
        job = self.job
        step = self.steps.run_to_end("prepare", 120)
        order = {}
        for line in step.lines:
            words = line.split(":", 1)[-1].split()
            if len(words) == 2 and words[0].isdigit():
                order[int(words[0])] = words[1]
        if sorted(order) != list(range(len(job.nodes))):
            raise Fatal(f"prepare did not report every node: {step.lines[-5:]}")
        if [order[i] for i in sorted(order)] != [n.name for n in job.nodes]:
            by_name = {n.name: n for n in job.nodes}
            job.nodes = [by_name[order[i]] for i in sorted(order)]  # rank = SLURM_NODEID of all-node steps
            self.export_nodes()
            job.events.write("node-order", nodes=[n.name for n in job.nodes])
        target = os.path.join(job.options.node_dir, "job.sh")
        self.sbcast(job.script, target)
        job.events.write("nodes-prepared", node_dir=job.options.node_dir, script_copy=target)

    def sbcast(self, source: str, target: str) -> None:
        proc = subprocess.run(["sbcast", "--force", source, target], capture_output=True, text=True,
                              timeout=120, check=False)
        if proc.returncode != 0:
            raise Fatal(f"sbcast of {source} to {target} failed: {proc.stderr.strip()}")

    def install_secrets(self) -> None:
        """Unless gms_insecure: the job's own credentials on every node (slurm/job_secrets.py), before anything
        that uses them starts; then the supervisor's etcd client, as the agents' identity."""
        job = self.job
        plan = job.job_plan
        if plan.secure and plan.security is not None:
            scratch = tempfile.mkdtemp(prefix="shadowline-bundle-")
            try:
                bundle = os.path.join(scratch, BUNDLE)
                self.passwords = make_bundle(plan, bundle)
                self.sbcast(bundle, os.path.join(job.options.node_dir, BUNDLE))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            if self.steps.run_to_end("secrets", 60).popen.returncode != 0:
                raise Fatal("the job's credentials could not be installed on every node (see steps/secrets.1.log)")
            job.events.write("secrets-installed", directory=plan.security.dir)
        job.etcd = etcd_for(plan, timeout=1.0)

    def check_model(self) -> None:
        job = self.job
        if not job.options.model_check:
            return
        step = self.steps.run_to_end("model_check", 300)
        statuses: dict[str, Any] = {}
        notes = []
        for line in step.lines:
            text = line.split(":", 1)[-1].strip() if line[:1].isdigit() else line.strip()
            if not text.startswith("{"):
                continue
            report = json_object(text)
            statuses[report.get("node", "?")] = report.get("status")
            if report.get("problem"):
                notes.append(f"{report.get('node')}: {report['problem']}")
        for node in job.nodes:
            statuses.setdefault(node.name, None)
        plan = job.job_plan
        problems = readiness_gate(statuses, expected_revision=plan.revision, expected_model_id=plan.model_id)
        if problems:
            job.events.write("model-not-ready", problems=problems, notes=notes)
            raise Fatal("the model is not ready on every node: " + " ".join(problems + notes))
        digests = sorted({s["digest"] for s in statuses.values() if s})
        job.events.write("model-ready", model=plan.model_id, revision=plan.revision, digest=digests[0])

    def start_infra(self) -> None:
        job, steps = self.job, self.steps
        timeout = job.options.ready_timeout_s
        steps.launch("gms")
        if steps.run_to_end("gms_wait", timeout).popen.returncode != 0:
            raise Fatal("a GMS server did not come up (see steps/gms_wait.1.log and steps/gms.1.log)")
        infra = job.job_plan.infra
        if infra.etcd_proxies:  # Dynamo's processes reach etcd's TLS through it (slurm/etcd_proxy.py)
            steps.launch("etcd_proxy")
            if steps.run_to_end("etcd_proxy_wait", 60).popen.returncode != 0:
                raise Fatal("an etcd proxy did not come up (see steps/etcd_proxy_wait.1.log, steps/etcd_proxy.1.log)")
        steps.launch("etcd")
        endpoint = infra.etcd_endpoints.split(",")[0]
        try:
            context = etcd_context(job.job_plan)
        except EtcdError as err:
            raise Fatal(str(err)) from None
        steps.wait_ready("etcd", http_check(endpoint + "/health", context=context), 60)
        if self.passwords:
            try:
                changed = ensure_etcd_auth(endpoint, job.job_plan.deployment, self.passwords, context=context)
            except EtcdError as err:
                raise Fatal(f"could not turn on etcd's authentication: {err}") from None
            job.events.write("etcd-authentication", changed=changed)
        steps.launch("nats")
        host, port = infra.nats_server.split(",")[0].split("://")[-1].rsplit(":", 1)
        steps.wait_ready("nats", listening_check(host, [int(port)]), 60)
        steps.launch("frontend")
        steps.wait_ready("frontend", http_check(infra.frontend_url + "/health"), timeout)

    def start_cohorts(self) -> None:
        """The primary until it serves, then the shadows until each is parked, then a completion through the
        frontend: deployment-ready."""
        job = self.job
        timeout = job.options.ready_timeout_s
        cohorts = job.job_plan.cohort_ids
        self.steps.launch(f"cohort_{cohorts[0]}")
        self.wait_state(cohorts[0], ACTIVE, timeout)
        job.serving = cohorts[0]
        self.watch.leases.attribute_to(cohorts[0])
        for cohort in cohorts[1:]:
            self.steps.launch(f"cohort_{cohort}")
        for cohort in cohorts[1:]:
            self.wait_state(cohort, PARKED, timeout)
        started = time.monotonic()
        ready, waited, seen = poll(lambda: completion_problem(job.job_plan), 60, 0.1)
        if not ready:
            raise Fatal(f"no completion through the frontend within 60 s: {seen}")
        job.events.write("deployment-ready", cohort=cohorts[0], frontend=job.job_plan.infra.frontend_url,
                         first_completion_s=round(time.monotonic() - started, 3),
                         since_job_start_s=round(time.time() - job.started, 3))

    def wait_state(self, cohort: int, state: str, timeout: float) -> None:
        """Until ``cohort``'s leader is in ``state`` (parked: or already serving), which the watch then knows."""
        def check() -> str | None:
            current = leader_state(self.job.job_plan, cohort, timeout=0.5)
            if current == state or (state == PARKED and current == ACTIVE):
                self.watch.on_state(cohort, self.watch.states.get(cohort), current, time.time())
                return None
            return f"cohort {cohort}'s leader is {current or 'not answering'}"
        self.steps.wait_ready(f"cohort_{cohort}", check, timeout)
