"""The supervisor's step runner. Every step is the batch script's own ``step_<name>`` function, run as ``bash
SCRIPT step <name>`` (an ``srun`` inside), so what runs is what the script shows. A step's output goes to
``steps/<name>.<generation>.log``; the watchdog's ``SHADOWLINE_EVENT`` lines in it become ``task-event`` messages
to the supervisor's loop; its Slurm id (``<job>.<step>``) is found with ``squeue`` by its name."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from typing import Any, Callable

from .job_state import Fatal, JobState, Stopping
from .slots import Step, StepSlot
from .watchdog import EVENT_PREFIX

LOOP_INTERVAL = 0.05


class StepRunner:
    """Launches the job's steps, each in its slot; runs one-off steps to their end; waits for a step to be ready;
    stops steps."""

    def __init__(self, job: JobState) -> None:
        self.job = job
        self.known_step_ids: set[str] = set()

    def launch(self, name: str) -> Step:
        job = self.job
        slot = job.slots.setdefault(name, StepSlot(name))
        slot.generation += 1
        log_path = os.path.join(job.job_dir, "steps", f"{name}.{slot.generation}.log")
        popen = subprocess.Popen(["bash", job.script, "step", name], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, errors="replace",
                                 start_new_session=True)
        step = Step(name, slot.generation, popen, log_path)
        slot.step = step
        slot.history.append(step)
        threading.Thread(target=self.read_output, args=(step,), name=f"out-{name}", daemon=True).start()
        threading.Thread(target=self.find_step_id, args=(step,), name=f"id-{name}", daemon=True).start()
        job.events.write("step-launched", cohort=step.cohort, generation=step.generation, step=name, pid=popen.pid)
        return step

    def read_output(self, step: Step) -> None:
        with open(step.log_path, "a", encoding="utf-8") as log:
            for line in step.popen.stdout:  # type: ignore[union-attr]
                log.write(line)
                log.flush()
                step.lines.append(line.rstrip("\n"))
                if EVENT_PREFIX in line:
                    record = json_object(line.split(EVENT_PREFIX, 1)[1])
                    if record:
                        self.job.messages.put(("task-event", step, record))

    def find_step_id(self, step: Step) -> None:
        """The step's id (job.step) from squeue, by its name, among the steps not seen before."""
        slurm_name = step.name.replace("_", "-")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and step.step_id is None and step.popen.poll() is None:
            out = subprocess.run(["squeue", "-h", "-s", "-j", self.job.job_id, "-o", "%i %j"], capture_output=True,
                                 text=True, timeout=10, check=False).stdout
            for line in out.splitlines():
                words = line.split()
                if len(words) == 2 and words[1] == slurm_name and words[0] not in self.known_step_ids:
                    step.step_id = words[0]
                    break
            time.sleep(0.05)
        if step.step_id:
            self.known_step_ids.add(step.step_id)
            self.job.write_job()

    def run_to_end(self, name: str, timeout: float, stoppable: bool = True) -> Step:
        step = self.launch(name)
        deadline = time.monotonic() + timeout
        while step.popen.poll() is None:
            if stoppable and self.job.stop_reason is not None:
                step.popen.kill()
                raise Stopping
            if time.monotonic() > deadline:
                step.popen.kill()
                raise Fatal(f"step {name} did not finish within {timeout:g} s (see {step.log_path})")
            time.sleep(LOOP_INTERVAL)
        step.ended = time.time()
        time.sleep(0.1)  # let the reader drain
        self.job.events.write("step-ended", step=name, step_id=step.step_id, exit=step.popen.returncode,
                              ran_s=round(step.ended - step.started, 3))
        if step.popen.returncode != 0 and name != "gms_wait":
            raise Fatal(f"step {name} failed with status {step.popen.returncode}: {' | '.join(step.lines[-5:])}")
        return step

    def wait_ready(self, name: str, check: Callable[[], str | None], timeout: float) -> None:
        """Until ``check`` finds no problem with the running step ``name``."""
        step = self.job.slots[name].step
        started = time.monotonic()
        while True:
            if self.job.stop_reason is not None:
                raise Stopping
            problem = check()
            if problem is None:
                self.job.events.write("ready", step=name, step_id=step.step_id if step else None,
                                      after_s=round(time.monotonic() - started, 3))
                return
            if step is not None and step.popen.poll() is not None:
                raise Fatal(f"{name} ended with status {step.popen.returncode} before it was ready: "
                            f"{' | '.join(step.lines[-5:])}")
            if time.monotonic() - started > timeout:
                raise Fatal(f"{name} not ready after {timeout:g} s: {problem}")
            time.sleep(0.1)

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
            self.job.events.write("step-stopped", cohort=step.cohort, generation=step.generation, step=step.name,
                                  step_id=step.step_id, exit=step.popen.returncode)


def json_object(text: str) -> dict[str, Any]:
    """``text`` as a JSON object; {} when it is not one."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
