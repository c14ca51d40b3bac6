"""The drill report computed from recorded drills (tests/unit/data/drills/<fault>.json: the evidence of a real
drill on the 3-host testbed - the fault, every node's agent events, the load's requests, the state before and
after), variations of them, the timeline table and SVG, where faults land, and the load generator."""

from __future__ import annotations

import json
import threading
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan import Plan
from shadowline.deployment.plan_builder import build_plan
from shadowline.drill.faults import FAULTS, DrillError, choose_target
from shadowline.drill.load import run_load, summarize
from shadowline.drill.report import compute_report, fault_time
from shadowline.drill.report_text import render_timeline_table
from shadowline.drill.svg import render_svg
from tests.unit.helpers import hostvars

DATA = Path(__file__).parent / "data" / "drills"


def recorded(fault: str) -> dict[str, Any]:
    return json.loads((DATA / f"{fault}.json").read_text())


def first(evidence: dict[str, Any], name: str, **match: Any) -> dict[str, Any]:
    t0 = fault_time(evidence)
    return min((e for e in evidence["events"] if e["event"] == name and e["time"] >= t0
                and all(e.get(k) == v for k, v in match.items())), key=lambda e: e["time"])


@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_recorded_drill_passes(fault: str) -> None:
    report = compute_report(recorded(fault))
    assert report["passed"], report["problems"]
    assert report["orphans"] == []
    for key in ("fault", "detect_s", "teardown_s", "promote_s", "first_ok_s", "failed_before_promotion",
                "failed_after_promotion", "orphans", "relaunch_s"):
        assert key in report


def test_kill_leader_figures_follow_the_events() -> None:
    evidence = recorded("kill-leader")
    t0 = evidence["fault"]["injected_at"]
    report = compute_report(evidence)
    declared = first(evidence, "failure-declared")
    assert report["detect_s"] == round(declared["time"] - t0, 3)
    assert report["detect_reason"] == "rank-exited"
    gone = {e["node"]: round(e["time"] - t0, 3) for e in evidence["events"] if e["event"] == "ranks-gone"
            and (e["cohort"], e["generation"]) == (declared["cohort"], declared["generation"])}
    assert report["teardown_per_node"] == gone and set(gone) == {"node0", "node1", "node2"}
    assert report["teardown_s"] == max(gone.values())
    promoted = first(evidence, "promoted")
    assert promoted["cohort"] != declared["cohort"]
    assert report["promote_s"] == round(promoted["time"] - t0, 3)
    assert report["promoted_cohort"] == promoted["cohort"]
    relaunched = first(evidence, "relaunch-complete", cohort=declared["cohort"])
    assert report["relaunch_s"] == round(relaunched["time"] - t0, 3)
    failed = [r for r in evidence["requests"] if not r["ok"] and r["end"] >= t0]
    assert report["failed_before_promotion"] == sum(1 for r in failed if r["start"] < promoted["time"])
    assert report["failed_after_promotion"] == sum(1 for r in failed if r["start"] >= promoted["time"])
    assert report["failed_before_promotion"] + report["failed_after_promotion"] == len(failed) > 0
    first_failed = min(r["start"] for r in failed)
    first_ok = min(r["end"] for r in evidence["requests"] if r["ok"] and r["start"] >= first_failed)
    assert report["first_ok_s"] == round(first_ok - t0, 3)
    assert report["serving_before"] != report["serving_after"] == f"engine-{promoted['cohort']}"


def test_an_orphan_fails_the_drill() -> None:
    evidence = recorded("kill-worker")
    report = compute_report(evidence)
    cohort = report["failed_generations"][0]["cohort"]
    proc = evidence["before"]["processes"]["node1"][str(cohort)]["processes"][0]
    evidence["after"]["survivors"]["node1"].append({"cohort": cohort, **proc, "stopped": False})
    report = compute_report(evidence)
    assert [o["pid"] for o in report["orphans"]] == [proc["pid"]]
    assert not report["passed"] and "still alive" in report["problems"][0]


def test_a_node_that_never_reports_its_ranks_gone() -> None:
    evidence = recorded("hang-leader")
    evidence["events"] = [e for e in evidence["events"] if not (e["event"] == "ranks-gone" and e["node"] == "node2")]
    report = compute_report(evidence)
    assert report["teardown_s"] is None and report["teardown_missing"] == ["node2"]
    assert any("not reported gone on node2" in p for p in report["problems"])


def test_a_hang_declared_for_the_wrong_reason() -> None:
    evidence = recorded("stall-generation")
    for e in evidence["events"]:
        if e["event"] == "failure-declared":
            e["detail"]["reason"] = "rank-exited"
    report = compute_report(evidence)
    assert any("expected generation-stalled" in p for p in report["problems"])


def test_a_standby_death_must_not_fail_a_request() -> None:
    evidence = recorded("kill-standby")
    assert compute_report(evidence)["requests"]["failed"] == 0
    t0 = evidence["fault"]["injected_at"]
    later = next(r for r in evidence["requests"] if r["start"] > t0)
    later.update(ok=False, status=503, error="Service Unavailable")
    report = compute_report(evidence)
    assert report["failed_before_promotion"] == 1 and report["promote_s"] is None
    assert any("must not interrupt serving" in p for p in report["problems"])


def test_kill_agent_adoption() -> None:
    evidence = recorded("kill-agent")
    report = compute_report(evidence)
    assert list(report["agents_restarted"]) == [evidence["fault"]["host"]]
    assert report["ranks_restarted"] == [] and report["promote_s"] is None  # the holder seen again is no promotion
    # A rank that the new agent did not adopt but restarted instead: a problem.
    host = evidence["fault"]["host"]
    gone = evidence["after"]["survivors"][host].pop(0)
    report = compute_report(evidence)
    assert [r["pid"] for r in report["ranks_restarted"]] == [gone["pid"]]
    assert any("must adopt" in p for p in report["problems"])


def test_kill_agent_adopting_other_pids() -> None:
    evidence = recorded("kill-agent")
    for e in evidence["events"]:
        if e["event"] == "agent-started":
            e["detail"]["adopted"] = {"0": 1, "1": 2}
    assert any("but the ranks running were" in p for p in compute_report(evidence)["problems"])


def test_kill_gms_needs_the_weights_back() -> None:
    evidence = recorded("kill-gms")
    host = evidence["fault"]["host"]
    assert compute_report(evidence)["gms_restarted"].keys() == {host}
    evidence["after"]["gms"][host]["resident"] = False
    report = compute_report(evidence)
    assert any("not resident again" in p for p in report["problems"])


def test_cut_node_measures_from_the_link_going_down() -> None:
    evidence = recorded("cut-node")
    report = compute_report(evidence)
    assert report["injected_at"] == evidence["fault"]["cut"]["down"]
    assert report["cut"]["down"] == 0.0 and report["cut"]["up"] >= 4.5
    assert report["requests"]["failed"] > 0 and report["serving_resumed"]


def test_a_dead_slot_fails_the_drill() -> None:
    evidence = recorded("kill-standby")
    declared = first(evidence, "failure-declared")
    evidence["events"].append({"time": declared["time"] + 1, "node": "node0", "cohort": declared["cohort"],
                               "generation": declared["generation"] + 1, "event": "slot-dead",
                               "detail": {"attempts": 6}})
    report = compute_report(evidence)
    assert report["slots_dead"] and any("dead" in p for p in report["problems"])


def test_unsettled_agents_fail_the_drill() -> None:
    evidence = recorded("kill-leader")
    evidence["after"].update(settled=False, settle_note="cohort 1 launching")
    report = compute_report(evidence)
    assert "the agents did not settle: cohort 1 launching" in report["problems"]


@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_table_is_short_and_says_the_result(fault: str) -> None:
    report = compute_report(recorded(fault))
    lines = render_timeline_table(report)
    assert len(lines) <= 55
    assert lines[0].startswith(f"drill {fault} on ")
    assert lines[-1] == "result: PASS"
    assert any(line.startswith("detect ") for line in lines)
    assert any("FAULT" in line for line in lines)


@pytest.mark.parametrize("fault", ["kill-leader", "cut-node"])
def test_the_svg_has_every_request_and_event(fault: str) -> None:
    evidence = recorded(fault)
    report = compute_report(evidence)
    svg = render_svg(report, evidence["requests"], evidence["nodes"])
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    bars = [r for r in root.iter(f"{ns}rect") if r.find(f"{ns}title") is not None]
    assert len(bars) == len(evidence["requests"])
    failed = [r for r in bars if r.get("fill") == "#d62728"]
    assert len(failed) == report["requests"]["failed"]
    markers = list(root.iter(f"{ns}circle"))
    node_rows = [r for r in report["timeline"] if r["node"] in evidence["nodes"]]
    assert len(markers) >= len(node_rows)


# --- where faults land ---------------------------------------------------------------------------------------------
def plan(nodes: int, cohorts: int = 2, backend: str = "standin") -> Plan:
    hv, hosts = hostvars(nodes, gms_cohorts=cohorts,
                         gms_engine={"backend": backend, "tensor_parallel_size": nodes, "gpus_per_node": 1})
    contract, problems = parse_contract(hv, hosts)
    assert contract is not None, problems
    return build_plan(contract)


def test_targets_on_three_nodes() -> None:
    three = plan(3)
    assert {k: choose_target(three, "kill-leader", "engine-1")[k] for k in ("host", "cohort")} == \
        {"host": "node0", "cohort": 1}
    assert {k: choose_target(three, "kill-worker", "engine-0")[k] for k in ("host", "cohort")} == \
        {"host": "node2", "cohort": 0}
    assert choose_target(three, "kill-standby", "engine-0")["cohort"] == 1
    assert choose_target(three, "cut-node", "engine-0")["host"] == "node2"
    assert choose_target(three, "kill-agent", "engine-0", host="node1")["host"] == "node1"
    assert choose_target(three, "hang-worker", "engine-0", host="node1")["node_rank"] == 1


@pytest.mark.parametrize(("fault", "kwargs", "nodes", "says"), [
    ("cut-node", {"host": "node0"}, 3, "non-leader"),
    ("kill-leader", {"host": "node1"}, 3, "leader node"),
    ("kill-worker", {}, 1, "one node"),
    ("kill-standby", {}, 1, None),
    ("no-such-fault", {}, 3, "not a drill fault"),
])
def test_targets_refused(fault: str, kwargs: dict[str, Any], nodes: int, says: str | None) -> None:
    p = plan(nodes, cohorts=1 if fault == "kill-standby" else 2)
    with pytest.raises(DrillError) as err:
        choose_target(p, fault, "engine-0", **kwargs)
    assert says is None or says in str(err.value)


def test_nothing_serves_nothing_to_drill() -> None:
    with pytest.raises(DrillError, match="no cohort holds the failover lock"):
        choose_target(plan(2), "kill-leader", None)


def test_stall_generation_needs_the_standin() -> None:
    with pytest.raises(DrillError, match="stand-in"):
        choose_target(plan(2, backend="dynamo_vllm"), "stall-generation", "engine-0")


# --- the load generator ----------------------------------------------------------------------------------------
class Frontend(BaseHTTPRequestHandler):
    """200 with a completion for the first ``ok_first`` requests, then 503; ``delay`` seconds per answer."""

    served = 0
    ok_first = 5
    delay = 0.0
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802
        asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with Frontend.lock:
            Frontend.served += 1
            ok = Frontend.served <= Frontend.ok_first
        if Frontend.delay:
            threading.Event().wait(Frontend.delay)
        answer: dict[str, Any] = {"choices": [{"message": {"content": None}}]} if ok else {"message": "unavailable"}
        if ok and asked.get("nvext") == {"extra_fields": ["worker_id"]}:  # Dynamo names the worker when asked
            answer["nvext"] = {"worker_id": {"prefill_worker_id": 255, "decode_worker_id": 255}}
        body = json.dumps(answer).encode()
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def frontend():
    Frontend.served, Frontend.ok_first, Frontend.delay = 0, 5, 0.0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Frontend)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_load_is_bounded_and_records_every_answer(frontend: str) -> None:
    requests = run_load(frontend, "m", rate=40, duration_s=0.5, max_requests=100, timeout_s=2)
    assert len(requests) == 20  # 40/s for 0.5 s, open loop
    assert [r.seq for r in requests] == list(range(20))
    assert sum(r.ok for r in requests) == 5 and {r.status for r in requests if not r.ok} == {503}
    assert {r.worker for r in requests if r.ok} == {"ff"} and {r.worker for r in requests if not r.ok} == {""}
    spacing = [b.start - a.start for a, b in zip(requests, requests[1:])]
    assert max(spacing) < 0.5, spacing  # open loop at 0.025 s; a safety bound for a loaded machine
    summary = summarize(requests)
    assert summary["sent"] == 20 and summary["failed"] == 15


def test_load_stops_on_count_and_on_request(frontend: str) -> None:
    assert len(run_load(frontend, "m", rate=100, duration_s=10, max_requests=7, timeout_s=2)) == 7
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    requests = run_load(frontend, "m", rate=20, duration_s=10, max_requests=1000, timeout_s=2, stop=stop)
    assert 4 <= len(requests) <= 9


def test_a_request_that_does_not_answer_in_time_fails(frontend: str) -> None:
    Frontend.delay = 1.0
    requests = run_load(frontend, "m", rate=10, duration_s=0.2, max_requests=2, timeout_s=0.3)
    assert requests and all(not r.ok and r.status == 0 for r in requests)
    assert all(0.25 < r.end - r.start < 0.9 for r in requests)


def test_a_promotion_of_a_failing_shadow_does_not_count() -> None:
    """cut-node: every cohort has a rank on the cut node; the parked shadow takes the lock while its own
    collective is stalled and is declared failed too. The promotion is the relaunched cohort's."""
    evidence = recorded("cut-node")
    t0 = fault_time(evidence)
    declared = {(e["cohort"], e["generation"]) for e in evidence["events"] if e["event"] == "failure-declared"}
    promoted = sorted((e for e in evidence["events"] if e["event"] == "promoted" and e["time"] >= t0),
                      key=lambda e: e["time"])
    void = [e for e in promoted if (e["cohort"], e["generation"]) in declared]
    assert void, "the recording has the void promotion"
    report = compute_report(evidence)
    real = next(e for e in promoted if (e["cohort"], e["generation"]) not in declared)
    assert report["promote_s"] == round(real["time"] - t0, 3) > round(void[0]["time"] - t0, 3)


def test_events_of_a_cohort_without_a_generation_are_not_teardowns() -> None:
    """gms-republish ("the writer is relaunching already") and lock-replaced name a cohort and no generation: the
    report reads past them (a kill-gms drill once failed computing its report on one)."""
    evidence = recorded("kill-gms")
    t0 = fault_time(evidence)
    evidence["events"].append({"cohort": 0, "generation": None, "event": "gms-republish", "node": "node0",
                               "time": t0 + 0.5, "detail": {"detail": "the writer is relaunching already"}})
    assert compute_report(evidence)["fault"] == "kill-gms"


def test_requests_through_the_sdk_count_both_ways_and_name_the_first_attempts_error() -> None:
    """A request whose first attempt got a 503 and whose SDK retry was served: failed for a client without
    retries (the window, the table's 503), served for the application (failed_sdk)."""
    evidence = recorded("kill-leader")
    t0 = evidence["fault"]["injected_at"]
    plain_failed = [r for r in evidence["requests"] if not r["ok"] and r["end"] >= t0]
    for r in plain_failed:  # the same requests, as the SDK client records them: its retry was served
        r.update({"first_ok": False, "first_status": r["status"], "ok": True, "status": 200, "attempts": 2,
                  "stream": False})
    for r in evidence["requests"]:
        r.setdefault("first_ok", True)
    report = compute_report(evidence)
    requests = report["requests"]
    assert requests["failed_raw"] == requests["failed"] == len(plain_failed) > 0
    assert requests["failed_sdk"] == 0 and requests["client"] == "openai"
    assert "200" not in requests["errors"] and sum(requests["errors"].values()) == len(plain_failed)
    assert "through the OpenAI SDK: 0 failed after its retries" in "\n".join(render_timeline_table(report))
