"""The supervisor's watch, once every cohort is up. Its loop (Supervisor.run), every 50 ms:

1. ``handle_messages``: what the observer thread (``observe``: every leader's failover state every 100 ms,
   discovery every 250 ms) and the steps' watchdogs and GMS keepers (task events) sent: states and promotions are
   logged, new discovery leases attributed to the cohort that registered them (slurm/leases.py), a GMS server
   started again answered by the writer's republish (``republish``);
2. ``collect_ended_steps``: a step that ended (a rank died; the watchdog ended a hung one; ``scancel
   <job>.<step>``) is logged, its cohort's leases revoked, and its relaunch decided, the node agent's way
   (slots.relaunch_decision): at once after a run of stable_after_s, after a backoff that doubles with each
   quick failure in a row, or the slot given up past max_relaunch_attempts; every cohort given up ends the job;
3. ``relaunch_due``: the slots whose delay passed are launched again (a cohort as a fresh shadow); a serving
   cohort's relaunch waits until the promoted shadow serves (at most PROMOTION_WAIT), so the two do not compete
   for CPU.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from ..cluster import discovery
from ..cluster.cohort_state import leader_state
from ..cluster.waits import poll
from ..common.etcd_client import EtcdError
from ..common.frontend import complete
from ..common.policy import REPUBLISH, REPUBLISH_DEGRADED, republish_choice
from ..deployment.plan import Plan
from .job_state import Fatal, JobState
from .leases import Leases
from .slots import ACTIVE, PARKED, Step, StepSlot, relaunch_decision
from .steps import StepRunner

PROMOTION_WAIT = 5.0  # seconds a serving cohort's relaunch waits for the promoted shadow to serve (CPU goes to it)
OBSERVE_INTERVAL = 0.1


def completion_problem(plan: Plan) -> str | None:
    """None when a completion through the frontend succeeds, else what it answered."""
    status, text = complete(plan.infra.frontend_url, plan.model_id, timeout=5)
    return None if status == 200 else f"HTTP {status}: {text[:120]}"


class Watch:
    def __init__(self, job: JobState, steps: StepRunner) -> None:
        self.job = job
        self.steps = steps
        self.leases = Leases(job)
        self.states: dict[int, str | None] = {}
        self.awaiting_serving = False  # a serving cohort ended; its relaunch waits until a shadow serves

    # -- what happened ---------------------------------------------------------------------------------- #

    def observe(self) -> None:
        """Background: each cohort leader's failover state and discovery's leases, as messages to the loop."""
        job = self.job
        last: dict[int, str | None] = dict(self.states)
        next_leases = 0.0
        plan = job.job_plan
        while job.stop_reason is None:
            for cohort in plan.cohort_ids:
                state = leader_state(plan, cohort, timeout=0.3)
                if state != last.get(cohort):
                    job.messages.put(("state", cohort, last.get(cohort), state, time.time()))
                    last[cohort] = state
            if time.monotonic() >= next_leases:
                next_leases = time.monotonic() + 0.25
                try:
                    job.messages.put(("leases", discovery.registrations(job.etcd)))
                except EtcdError:
                    pass
            time.sleep(OBSERVE_INTERVAL)

    def handle_messages(self) -> None:
        while True:
            try:
                message = self.job.messages.get_nowait()
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
        job = self.job
        self.states[cohort] = after
        slot = job.slots.get(f"cohort_{cohort}")
        step = slot.step if slot else None
        if after is None:
            return
        generation = step.generation if step else None
        job.events.write("state", cohort=cohort, generation=generation, when=when, before=before, after=after)
        if slot and step and after in (PARKED, ACTIVE):
            if step.reached != ACTIVE:
                step.reached = after
            if after == PARKED and slot.last_end is not None and generation and generation > 1:
                job.events.write("parked", cohort=cohort, generation=generation, when=when,
                                 since_end_s=round(when - slot.last_end, 3), step_id=step.step_id)
        if after == ACTIVE and job.serving != cohort:
            previous = job.serving if job.serving is not None else job.last_served
            job.serving = cohort
            job.events.write("promoted", cohort=cohort, generation=generation, when=when, previous=previous,
                             step_id=step.step_id if step else None)
            threading.Thread(target=self.report_serving, args=(cohort, generation, when), daemon=True).start()

    def report_serving(self, cohort: int, generation: int | None, promoted: float) -> None:
        ready, _unused, seen = poll(lambda: completion_problem(self.job.job_plan), 30, 0.05)
        if ready:
            self.awaiting_serving = False
            self.job.events.write("serving", cohort=cohort, generation=generation,
                                  since_promotion_s=round(time.time() - promoted, 3))
        else:
            self.job.events.write("not-serving", cohort=cohort, generation=generation, last=seen)

    def on_leases(self, registrations: list[discovery.Registration]) -> None:
        live = [c for c, state in self.states.items() if state in ("waking", ACTIVE) and self.running(c)]
        self.leases.attribute(registrations, live)

    def running(self, cohort: int) -> bool:
        slot = self.job.slots.get(f"cohort_{cohort}")
        return bool(slot and slot.step and slot.step.ended is None and slot.step.popen.poll() is None)

    def on_task_event(self, step: Step, record: dict[str, Any]) -> None:
        detail = dict(record.get("detail") or {})
        if record.get("step"):
            detail["step_id"] = record["step"]
            if step.step_id is None:
                step.step_id = record["step"]
        detail["rank"] = record.get("rank")
        if record.get("event") == "hang-detected":
            step.hang = detail.get("reason")
        source = "watchdog" if step.cohort is not None else step.name  # a rank's watchdog, or a server's keeper
        self.job.events.write(f"{source}-{record.get('event')}", cohort=step.cohort, generation=step.generation,
                              node=record.get("node"), when=record.get("time"), **detail)
        if step.name == "gms" and record.get("event") == "restarted":
            self.republish(record.get("node"))

    def republish(self, node: str | None) -> None:
        """A node's GMS server started again, empty: the writer cohort (ENGINE_ID 0) republishes, the node agent's
        way (policy.republish_choice): its step is ended (SIGTERM to its srun: the watchdogs kill the ranks at once)
        and relaunched by the usual path, a parked shadow serving meanwhile if the writer served."""
        job = self.job
        writer = 0  # ENGINE_ID 0: loads from disk and publishes (deployment/plan_builder.py)
        slot = job.slots.get(f"cohort_{writer}")
        step = slot.step if slot else None
        parked = any(state == PARKED and self.running(c) for c, state in self.states.items() if c != writer)
        choice = republish_choice(self.running(writer), job.serving == writer, parked)
        job.events.write("gms-republish" if choice != REPUBLISH_DEGRADED else "gms-degraded", cohort=writer,
                         generation=step.generation if step else None, node=node, choice=choice,
                         serving=job.serving)
        if choice == REPUBLISH and step is not None:
            step.popen.terminate()

    # -- steps that ended, and their relaunch ----------------------------------------------------------- #

    def collect_ended_steps(self) -> None:
        job = self.job
        for slot in job.slots.values():
            step = slot.step
            if step is not None and step.ended is None and step.popen.poll() is not None:
                self.step_ended(slot, step)
        if job.slots and all(s.given_up for n, s in job.slots.items() if n.startswith("cohort_")):
            raise Fatal("every cohort was given up after repeated failures")

    def step_ended(self, slot: StepSlot, step: Step) -> None:
        """Record the end, fence the cohort, note a serving cohort's end, and decide the relaunch."""
        job = self.job
        step.ended = time.time()
        slot.last_end = step.ended
        self.handle_messages()  # the watchdog's last words, if any
        cohort = step.cohort
        job.events.write("step-ended", cohort=cohort, generation=step.generation, step=step.name,
                         step_id=step.step_id, exit=step.popen.returncode, ran_s=round(step.ended - step.started, 3),
                         reached=step.reached, hang=step.hang)
        slot.after_promotion = False
        if cohort is not None:
            self.leases.revoke(cohort, step.generation)
            if job.serving == cohort:
                job.serving, job.last_served = None, cohort
                slot.after_promotion = any(s in (PARKED, "waking", ACTIVE) for c, s in self.states.items()
                                           if c != cohort)
                self.awaiting_serving = slot.after_promotion
        decision = relaunch_decision(slot, step, job.relaunch)
        slot.book(decision, time.monotonic())
        if decision.gives_up:
            job.events.write("gave-up", cohort=cohort, generation=step.generation, step=step.name,
                             attempts=decision.attempts)
            return
        job.events.write("relaunch-scheduled", cohort=cohort, generation=step.generation + 1, step=step.name,
                         delay_s=round(decision.delay_s, 3), attempts=decision.attempts)
        job.write_job()

    def relaunch_due(self) -> None:
        now = time.monotonic()
        for slot in self.job.slots.values():
            if slot.due is None or now < slot.due or slot.given_up:
                continue
            if slot.after_promotion and self.awaiting_serving and now < slot.due + PROMOTION_WAIT:
                continue  # the failover first: a booting shadow would compete for CPU with the promotion
            slot.due = None
            since = time.time() - slot.last_end if slot.last_end else None
            step = self.steps.launch(slot.name)
            self.job.events.write("relaunched", cohort=step.cohort, generation=step.generation, step=slot.name,
                                  since_end_s=round(since, 3) if since is not None else None)
