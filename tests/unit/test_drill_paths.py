"""The drills of both paths share one fault vocabulary, one load client and one report computation (issue #38):
the same recorded requests and events give the agents' drill report and the Slurm drill's report the same
figures."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from shadowline.drill.faults import FAULTS, SLURM_FAULTS, VOCABULARY
from shadowline.drill.load import Load
from shadowline.drill.report import compute_report, fault_time
from shadowline.drill.slurm import Observed
from shadowline.drill.slurm import report as slurm_report
from tests.unit.test_drill_report import frontend  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "drills"
FIGURES = ("promote_s", "first_ok_s", "failed_before_promotion", "failed_after_promotion", "teardown_s",
           "relaunch_s")


def slurm_observation(evidence: dict[str, Any], agents: dict[str, Any]) -> Observed:
    """The Slurm drill's inputs, gathered from the agents' recording: the same requests and fault time, the
    promotion and the refilled slot at the driver's events, every node's ranks of the failed generation gone at
    its ranks-gone event."""
    t0 = fault_time(evidence)
    events = [e for e in evidence["events"] if e["time"] >= t0 - 1e-6]
    cohort = int(evidence["fault"]["cohort"])
    generation = next(g["generation"] for g in agents["failed_generations"] if g["cohort"] == cohort)
    promoted = next(e for e in events if e["event"] == "promoted" and e["cohort"] == agents["promoted_cohort"])
    parked = next(e for e in events if e["event"] == "relaunch-complete" and e["cohort"] == cohort
                  and e["generation"] > generation)
    nodes = []
    for node in evidence["nodes"]:
        gone = min(e["time"] for e in events if e["event"] == "ranks-gone" and e["node"] == node
                   and (e["cohort"], e["generation"]) == (cohort, generation))
        nodes.append({"node": node, "target": None, "fault_at": None, "first_gone": gone, "all_gone": gone,
                      "pids": [], "left": []})
    return Observed(fault=evidence["fault"]["name"], job_id="1", failed_cohort=cohort, step_id="1.0", fault_at=t0,
                    nodes=nodes, promoted=(promoted["cohort"], promoted["time"]), parked=parked["time"],
                    requests=evidence["requests"], events=[], shadows=[agents["promoted_cohort"]], registrations=[])


@pytest.mark.parametrize("fault", sorted(set(SLURM_FAULTS) & set(FAULTS)))
def test_both_paths_report_the_same_figures_of_one_recording(fault: str) -> None:
    evidence = json.loads((DATA / f"{fault}.json").read_text())
    agents = compute_report(evidence)
    slurm = slurm_report(slurm_observation(evidence, agents))
    assert {k: slurm[k] for k in FIGURES} == {k: agents[k] for k in FIGURES}
    assert slurm["promoted_cohort"] == agents["promoted_cohort"]
    assert len(slurm["failures"]) == min(30, agents["failed_before_promotion"] + agents["failed_after_promotion"])
    assert slurm["requests"] == agents["requests"]["sent"]


def test_one_fault_vocabulary_for_both_paths() -> None:
    names = [f.name for f in VOCABULARY]
    assert len(names) == len(set(names))
    assert set(FAULTS) | set(SLURM_FAULTS) == set(names)
    assert {n: f.slurm for n, f in SLURM_FAULTS.items()} == {
        "kill-leader": "kill", "kill-worker": "kill", "hang-leader": "stop", "hang-worker": "stop",
        "scancel-step": "none"}
    assert "scancel-step" not in FAULTS, "the agents' drill has no Slurm step to cancel"
    usage = subprocess.run([sys.executable, str(ROOT / "slurm" / "drill"), "--help"], capture_output=True, text=True,
                           check=False).stdout
    assert "hang-leader,hang-worker,kill-leader,kill-worker,scancel-step" in usage, usage


def test_the_slurm_drills_load_is_the_load_client_until_stopped(frontend: str) -> None:  # noqa: F811
    load = Load(frontend, "m", rate=40, timeout=2).start()
    threading.Event().wait(1.0)  # 40 at 40/s: at least 6 on a loaded machine
    requests = load.stop()
    assert 6 <= len(requests) <= 60 and [r.seq for r in requests] == list(range(len(requests)))
    assert sum(r.ok for r in requests) == 5 and {r.status for r in requests if not r.ok} == {503}
    assert set(requests[0].to_dict()) >= {"seq", "start", "end", "status", "ok", "error"}
