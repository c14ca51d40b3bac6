#!/usr/bin/env python3
"""Failover figures on the testbed's Slurm cluster (instance 3, 2 nodes): N drills of each fault on one job.

    .venv/bin/python tests/slurm/measure_drills.py --trials 5 [--faults kill-worker,kill-leader,hang-leader]

Boots (or reuses) testbed instance 3 with Slurm, stages the tiny model, renders and submits the same job as
tests/slurm/test_slurm_job.py, runs slurm/drill on node0 --trials times per fault (alternating which cohort
serves), prints min / median / max of every figure, writes all reports to --out, scancels the job and takes
the testbed down (unless --keep). Root only; traffic stays on 198.18.3.0/24.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "plugins" / "module_utils")]

from shadowline.model.spec import spec_from_inventory  # noqa: E402
from shadowline.model.stage import ensure_model  # noqa: E402
from tests.slurm.instance import tb  # noqa: E402  (testbed instance 3)
from tests.slurm.test_slurm_job import DEV_PY, REVISION, RUNTIME_PY, events, inventory, on, wait_for  # noqa: E402

FIGURES = ("detect_s", "teardown_s", "promote_s", "first_ok_s", "relaunch_started_s", "relaunch_s",
           "failed_before_promotion", "failed_after_promotion")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--faults", default="kill-worker,kill-leader,hang-leader")
    p.add_argument("--out", default=str(REPO / ".cache" / "slurm-measure.json"))
    p.add_argument("--keep", action="store_true", help="leave the testbed up")
    args = p.parse_args()
    run = REPO / ".cache" / "slurm-tests" / uuid.uuid4().hex[:12]
    (run / "jobs").mkdir(parents=True)
    model_dir = run / "models" / "tiny-llama"
    ensure_model(spec_from_inventory({"id": "shadowline/tiny-llama", "revision": REVISION,
                                      "source": f"file://{REPO}/.cache/models/tiny-llama",
                                      "local_dir": str(model_dir)}))
    script = run / "job.sbatch"
    subprocess.run([str(DEV_PY), str(REPO / "slurm" / "render"), "-i", str(inventory(run, model_dir, run / "jobs")),
                    "--out", str(script)], check=True, capture_output=True)
    tb.up(2, True)
    job_id = on("node0", "bash", "-c", f"cd {run} && sbatch --parsable {script}").strip()
    job_dir = run / "jobs" / f"shadowline-slurmtest-{job_id}"
    results: dict[str, list[dict]] = {}
    try:
        wait_for(lambda: any(e["event"] == "deployment-ready" for e in events(job_dir)), 120, "the job to serve")
        ready = next(e for e in events(job_dir) if e["event"] == "deployment-ready")
        print(f"job {job_id}: deployment ready {ready['detail']['since_job_start_s']} s after the job started")
        for fault in args.faults.split(","):
            for trial in range(args.trials):
                on("node0", "rm", "-f", "/tmp/drill.json")
                proc = tb.exec_in("node0", [str(RUNTIME_PY), str(REPO / "slurm" / "drill"), "--job", job_id,
                                            "--fault", fault, "--timeout", "45", "--report", "/tmp/drill.json"],
                                  timeout=150)
                if proc.returncode != 0:
                    print(f"{fault} #{trial + 1}: drill failed (rc {proc.returncode}): {proc.stderr[-1500:]}")
                if not on("node0", "bash", "-c", "test -s /tmp/drill.json && echo yes || true").strip():
                    continue
                report = json.loads(on("node0", "cat", "/tmp/drill.json"))
                results.setdefault(fault, []).append(report)
                print(f"{fault} #{trial + 1}: rc {proc.returncode} " +
                      json.dumps({k: report[k] for k in FIGURES} | {"orphans": len(report["orphans"])}), flush=True)
                time.sleep(1.0)
    finally:
        on("node0", "scancel", job_id, check=False)
        Path(args.out).write_text(json.dumps(results, indent=1))
        if not args.keep:
            tb.down()
        shutil.rmtree(run, ignore_errors=True)
    print(f"\nload average at the end: {os.getloadavg()}")
    print(f"{'fault':<12} {'figure':<24} {'min':>7} {'median':>7} {'max':>7}")
    for fault, reports in results.items():
        for figure in FIGURES:
            values = [r[figure] for r in reports if r[figure] is not None]
            if values:
                low, mid, high = min(values), statistics.median(values), max(values)
                print(f"{fault:<12} {figure:<24} {low:>7.3f} {mid:>7.3f} {high:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
