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
   as the node agent relaunches a generation (common/policy.py ``RelaunchPolicy.after_death``): at once after
   a run of ``gms_failover.stable_after_s``, else after a delay that starts at ``relaunch_backoff_s`` and
   doubles with each quick failure in a row (parked or served meanwhile, or not); a slot past
   ``max_relaunch_attempts`` quick failures in a row is given up. A serving cohort's relaunch waits until the
   promoted shadow serves (at most 5 s), so the two do not compete for CPU; promotions and states are logged;
   a node's GMS server started again by its keeper (slurm/keeper.py) has the writer cohort republish
   (policy.republish_choice, the node agent's decision);
7. on SIGTERM/SIGINT (``scancel`` of the job, or ``--signal=B:TERM@<lead>`` before the time limit) stops the
   shadows, then the serving cohort, the frontend, NATS, etcd and the GMS servers, and removes the node
   directories.

The parts, each in its module: what they share (slurm/job_state.py), the steps and their slots
(slurm/slots.py), the step runner (slurm/steps.py), steps 1-5 (slurm/job_start.py), the watch of step 6
(slurm/watch.py, with discovery's leases in slurm/leases.py), step 7 (slurm/shutdown.py).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

from ..common import console
from .job_start import JobStart
from .job_state import Fatal, JobState, Stopping
from .shutdown import shutdown
from .steps import LOOP_INTERVAL, StepRunner
from .watch import Watch


class Supervisor:
    def __init__(self, script: str) -> None:
        self.job = JobState(script)
        self.steps = StepRunner(self.job)
        self.watch = Watch(self.job, self.steps)
        self.start = JobStart(self.job, self.steps, self.watch)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        job, start, watch = self.job, self.start, self.watch
        try:
            start.start_job()
            start.prepare_nodes()
            start.install_secrets()
            start.check_model()
            start.start_infra()
            start.start_cohorts()
            threading.Thread(target=watch.observe, name="observer", daemon=True).start()
            while job.stop_reason is None:
                watch.handle_messages()
                watch.collect_ended_steps()
                watch.relaunch_due()
                time.sleep(LOOP_INTERVAL)
        except Fatal as err:
            job.exit_code = 1
            job.stop_reason = job.stop_reason or "fatal"
            job.events.write("fatal", error=str(err))
            console.err(f"shadowline: {err}")
        except Stopping:
            pass
        shutdown(job, self.steps)
        return job.exit_code

    def on_signal(self, signum: int, _frame: Any) -> None:
        if self.job.stop_reason is None:
            self.job.stop_reason = signal.Signals(signum).name


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        console.err("usage: python -m shadowline.slurm.supervisor BATCH_SCRIPT (run by the rendered batch script)")
        return 2
    return Supervisor(args[0]).run()


if __name__ == "__main__":
    raise SystemExit(main())
