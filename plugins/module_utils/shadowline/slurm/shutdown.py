"""The job's end (on SIGTERM/SIGINT, a fatal error, or every cohort given up): the shadows first, then the
serving cohort, the frontend, NATS, etcd and the GMS servers (with the etcd proxies), each group asked to stop
and waited for (``gms_slurm.stop_grace_s``), then cancelled if it is still there; then ``cleanup`` (the node
directories) and ``job.json`` marked stopped."""

from __future__ import annotations

from .job_state import Fatal, JobState, Stopping
from .steps import StepRunner


def stop_order(cohort_ids: list[int], serving: int | None) -> list[list[str]]:
    """The steps to stop, group by group."""
    cohorts = [f"cohort_{c}" for c in cohort_ids]
    primary = f"cohort_{serving}" if serving is not None else None
    return [[n for n in cohorts if n != primary], [primary] if primary else [], ["frontend"], ["nats"],
            ["etcd"], ["gms", "etcd_proxy"]]


def shutdown(job: JobState, steps: StepRunner) -> None:
    reason = job.stop_reason or "done"
    job.stop_reason = reason
    job.events.write("shutdown", reason=reason)
    grace = float(job.options.stop_grace_s) + 2
    for group in stop_order(job.plan.cohort_ids if job.plan else [], job.serving):
        steps.stop_steps([job.slots[n].step for n in group if n in job.slots and job.slots[n].step], grace)
    if job.slots:
        try:
            steps.run_to_end("cleanup", 30, stoppable=False)
        except (Fatal, Stopping):
            pass
    job.write_job(state="stopped")
    job.events.write("stopped", exit=job.exit_code)
