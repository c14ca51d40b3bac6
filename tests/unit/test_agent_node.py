"""The node agent's decisions (control/node_duties.py), one by one: a view, observations, memory and a clock in,
actions out. No process, no etcd, no testbed."""

from __future__ import annotations

import threading

from shadowline.common.coordination import DEAD, FAILED, LAUNCHING, RUNNING, Slot
from shadowline.common.gpu_health import GpuFault
from shadowline.common.policy import HangPolicy
from shadowline.common.progress import Observation, ProgressSample
from shadowline.common.settings import Failover
from shadowline.common.xid_table import NODE_SERVICE, NONE, RESTART_APP
from shadowline.control.actions import (
    AbandonStart,
    CheckStart,
    Confirm,
    Declare,
    Fence,
    FinishTeardown,
    KillRest,
    Launch,
    Launched,
    LaunchFailed,
    MarkHealthy,
    NoteDetected,
    NoteProgress,
    ProbeLeader,
    Record,
    ReportFault,
    ReportGmsLost,
    ReportInvalid,
    SetGeneration,
    TearDown,
    Untrack,
    WakeAt,
)
from shadowline.control.memory import LocalRank, NodeMemory, Start, Teardown
from shadowline.control.node_duties import (
    abandon_stale_start,
    adopted_generation,
    gms_exited,
    gpu_faults,
    health_probe_timeout,
    judge_rank,
    judge_start,
    launch_due,
    leader_probes_due,
    rank_exited,
    refence,
    report_invalid,
    retire_leftover,
    settle_adopted,
    settle_failed,
    slot_failed,
    start_progress,
    starts_to_check,
    teardowns_due,
)
from shadowline.control.observe import HealthAnswer, StartCheck, UnitState
from shadowline.control.view import Active, DeploymentView, Invalid, Now, SlotEntry

FAILOVER = Failover(health_timeout_s=3.0, term_grace_s=0.0, planned_grace_s=5.0,
                    agent_lease_ttl_s=3, relaunch_backoff_s=1.0, relaunch_backoff_max_s=30.0,
                    max_relaunch_attempts=3, stable_after_s=30.0, wake_timeout_s=5.0, progress_stall_s=3.0,
                    canary_interval_s=1.0)
HANG = HangPolicy.of(FAILOVER)
T0 = 1_700_000_000.0  # wall clock of the tests' "now"
NOW = Now(wall=T0, mono=5000.0)


def at(seconds: float) -> Now:
    """The clock ``seconds`` after NOW."""
    return Now(wall=NOW.wall + seconds, mono=NOW.mono + seconds)


def rank(cohort: int = 0, generation: int = 1, leader: bool = True, healthy_at: float | None = None,
         started: float = T0 - 60, progress: Observation | None = None) -> LocalRank:
    return LocalRank(cohort=cohort, generation=generation, unit=f"shadowline-demo-engine@{cohort}.service",
                     pid=4242 + cohort, pidfd=None, cgroup=f"/system.slice/engine@{cohort}", leader=leader,
                     started=started, healthy_at=healthy_at, progress=progress, node="node0" if leader else "node2",
                     node_rank=0 if leader else 2)


def slot(cohort: int = 0, generation: int = 1, state: str = RUNNING, **kw: object) -> Slot:
    return Slot(cohort=cohort, generation=generation, state=state, since=kw.pop("since", T0 - 1), **kw)  # type: ignore[arg-type]


def memory(*ranks: LocalRank, **kw: object) -> NodeMemory:
    return NodeMemory(ranks={r.cohort: r for r in ranks}, **kw)  # type: ignore[arg-type]


def kinds(actions: list[object]) -> list[str]:
    return [type(a).__name__ if not isinstance(a, Record) else f"Record:{a.event}" for a in actions]


# --- a rank's exit ------------------------------------------------------------------------------------------------
def test_rank_exited_tears_down_locally_first_then_declares():
    """Local first: the rest of the rank is killed before the declaration waits on etcd."""
    r = rank()
    actions = rank_exited(r, NOW, FAILOVER)
    assert kinds(actions) == ["Record:rank-exited", "TearDown", "Declare"]
    assert actions[1] == TearDown(r, NOW.wall, 0.0)
    assert actions[2] == Declare(0, 1, "rank-exited")


# --- declared failures: the hot path and the reconcile ----------------------------------------------------------
def test_failed_slot_tears_down_this_nodes_rank_of_that_generation():
    r = rank(cohort=1, generation=3)
    failed = slot(1, 3, FAILED, reason="leader-hung", detected_by="node0")
    actions = slot_failed(failed, memory(r), FAILOVER)
    assert kinds(actions) == ["Record:teardown-requested", "NoteDetected", "TearDown"]
    assert actions[1] == NoteDetected(1, 3, failed.since)
    assert actions[2] == TearDown(r, failed.since, 0.0)


def test_failed_slot_leaves_a_newer_generation_and_running_slots_alone():
    assert slot_failed(slot(0, 1, FAILED), memory(rank(generation=2)), FAILOVER) == []
    assert slot_failed(slot(0, 1, RUNNING), memory(rank()), FAILOVER) == []
    assert slot_failed(slot(0, 1, FAILED), memory(), FAILOVER) == []


def test_dead_slot_tears_down_too():
    assert kinds(slot_failed(slot(0, 1, DEAD, reason="crash-loop"), memory(rank()), FAILOVER))[-1] == "TearDown"


def test_planned_failover_gives_the_grace_sigterm_then_sigkill():
    r = rank()
    planned = slot(0, 1, FAILED, reason="planned-failover")
    assert slot_failed(planned, memory(r), FAILOVER)[-1] == TearDown(r, planned.since, 5.0)
    # the grace ends: SIGKILL what is left; finished (confirmed) only once the cgroup is empty
    terminating = memory(terminating={0: Teardown(rank=r, since=planned.since, kill_at=NOW.mono + 5.0)})
    assert teardowns_due(terminating, {0: True}, at(1.0)) == []
    assert teardowns_due(terminating, {0: False}, at(1.0)) == [FinishTeardown(0)]
    assert teardowns_due(terminating, {0: True}, at(5.0)) == [KillRest(0)]


def test_a_handover_ends_the_ranks_at_once():
    """playbooks/upgrade.yml's handover: no drain (a draining engine deregisters itself: a 404 window)."""
    r = rank()
    handover = slot(0, 1, FAILED, reason="handover-failover")
    assert slot_failed(handover, memory(r), FAILOVER)[-1] == TearDown(r, handover.since, FAILOVER.term_grace_s)


def test_a_rank_that_outlives_sigkill_is_never_confirmed_gone_while_its_cgroup_has_processes():
    """Fault matrix row 9: a process in an uninterruptible wait survives SIGKILL for seconds."""
    r = rank(generation=2)
    stuck = memory(terminating={0: Teardown(rank=r, since=T0, kill_at=NOW.mono + 0.2, killed=True)})
    for seconds in (0.3, 1.0, 5.0):
        actions = teardowns_due(stuck, {0: True}, at(seconds))
        assert actions == [KillRest(0)]  # killed again, not finished
        assert not any(isinstance(a, (Confirm, FinishTeardown)) for a in actions)
        assert settle_failed(slot(0, 2, FAILED), stuck, FAILOVER, at(seconds)) == []  # no confirmation either
        assert launch_due(slot(0, 3, LAUNCHING, not_before=T0), stuck, at(seconds)) == []  # no relaunch here
    assert teardowns_due(stuck, {0: False}, at(5.1)) == [FinishTeardown(0)]


def test_untracked_processes_of_a_failed_generation_are_torn_down_not_confirmed():
    """After an agent restart, the unit of a failed cohort still has processes: kill them before confirming."""
    leftover = rank(generation=2)
    actions = settle_failed(slot(0, 2, FAILED), memory(), FAILOVER, NOW, leftover)
    assert kinds(actions) == ["Record:leftover-found", "TearDown"]


def test_failed_slot_with_nothing_here_is_confirmed_gone():
    assert settle_failed(slot(0, 2, FAILED), memory(), FAILOVER, NOW) == [Confirm(0, 2, NOW.wall)]
    # ...but not while this node's rank is still in its SIGTERM grace, and not for a dead slot
    r = rank(generation=2)
    grace = memory(terminating={0: Teardown(rank=r, since=T0, kill_at=NOW.mono + 5)})
    assert settle_failed(slot(0, 2, FAILED), grace, FAILOVER, NOW) == []
    assert settle_failed(slot(0, 2, DEAD), memory(), FAILOVER, NOW) == []


# --- launches -------------------------------------------------------------------------------------------------------
def test_launching_slot_without_a_rank_here_is_launched():
    launching = slot(0, 2, LAUNCHING, not_before=T0 - 0.5)
    assert launch_due(launching, memory(), NOW) == [NoteDetected(0, 1, launching.since), Launch(0, 2)]


def test_delayed_launch_wakes_at_its_not_before():
    launching = slot(0, 2, LAUNCHING, not_before=T0 + 4.0)
    assert launch_due(launching, memory(), NOW) == [WakeAt(NOW.mono + 4.0, full=True)]


def test_no_second_launch_while_starting_or_terminating_or_running():
    launching = slot(0, 2, LAUNCHING, not_before=0.0)
    assert launch_due(launching, memory(starting={0: Start(2, NOW.mono)}), NOW) == []
    assert launch_due(launching, memory(rank(generation=2)), NOW) == []
    grace = memory(terminating={0: Teardown(rank=rank(), since=T0, kill_at=NOW.mono + 5)})
    assert launch_due(launching, grace, NOW) == []


def test_leftover_of_an_older_generation_is_retired():
    old = rank(generation=1)
    assert retire_leftover(slot(0, 2, LAUNCHING), memory(old), FAILOVER, NOW) == [TearDown(old, NOW.wall, 0.0)]
    assert retire_leftover(slot(0, 1, RUNNING), memory(old), FAILOVER, NOW) == []


def test_start_that_runs_is_tracked():
    tracked = rank(generation=2)
    assert start_progress(0, Start(2, NOW.mono), tracked, None, NOW) == [Launched(tracked)]


def test_a_start_is_looked_at_once_asked_one_look_at_a_time_and_paced():
    """The look at a start's unit runs in a thread (systemctl show: 9-55 ms a call on a loaded host); one out per
    start, none before systemd was asked for the start job, none within 50 ms of the last answer."""
    asking = threading.Event()
    mem = memory(starting={0: Start(2, NOW.mono, asking), 1: Start(5, NOW.mono)})
    assert starts_to_check(mem, NOW) == [CheckStart(1, 5)]  # cohort 0's start job is still being asked for
    asking.set()
    mem.checking[1] = 5  # its look is out
    assert starts_to_check(mem, NOW) == [CheckStart(0, 2)]
    mem.checking.clear()
    mem.starting[0].looked_at = NOW.mono - 0.01
    assert starts_to_check(mem, NOW) == [CheckStart(1, 5)]
    assert starts_to_check(mem, at(0.05)) == [CheckStart(0, 2), CheckStart(1, 5)]
    mem.checking[0] = 1  # a look at an older start of cohort 0 is still out: it says nothing of this one
    assert CheckStart(0, 2) in starts_to_check(mem, at(0.05))


def test_a_look_is_judged_against_the_start_still_in_progress():
    tracked = rank(generation=2)
    start = Start(2, NOW.mono)
    assert judge_start(StartCheck(0, 2, tracked, None), start, NOW) == [Launched(tracked)]
    failed = UnitState("failed", "failed", "exit-code")
    assert kinds(judge_start(StartCheck(0, 2, None, failed), start, at(0.3))) == ["LaunchFailed", "Declare"]
    # the start was abandoned, or superseded, while the look was out: its find is let go, nothing judged
    assert judge_start(StartCheck(0, 2, tracked, None), None, NOW) == [Untrack(tracked)]
    assert judge_start(StartCheck(0, 2, tracked, None), Start(3, NOW.mono), NOW) == [Untrack(tracked)]
    assert judge_start(StartCheck(0, 2, None, failed), Start(3, NOW.mono), at(0.3)) == []
    # a look that failed is reported (at most every ERROR_REPORT_S, by the executor); the next one looks again
    assert judge_start(StartCheck(0, 2, None, None, "OSError: boom"), start, NOW) == [
        ReportFault("start-check-failed", 0, 2, "OSError: boom")]


def test_launch_failed_when_the_unit_failed():
    actions = start_progress(0, Start(2, NOW.mono), None, UnitState("failed", "failed", "exit-code"), at(0.3))
    assert actions == [LaunchFailed(0, 2, "the unit failed (exit-code)"), Declare(0, 2, "launch-failed")]


def test_launch_failed_when_the_start_job_never_ran():
    inactive = UnitState("inactive", "dead")
    assert start_progress(0, Start(2, NOW.mono), None, inactive, at(1.0)) == []  # the job may still be queued
    assert kinds(start_progress(0, Start(2, NOW.mono), None, inactive, at(2.5))) == ["LaunchFailed", "Declare"]


def test_slow_unit_start_fails_after_the_start_job_limit():
    activating = UnitState("activating", "start")
    assert start_progress(0, Start(2, NOW.mono), None, activating, at(29.0)) == []
    assert kinds(start_progress(0, Start(2, NOW.mono), None, activating, at(31.0))) == ["LaunchFailed", "Declare"]


def test_start_of_a_generation_that_failed_meanwhile_is_abandoned():
    starting = memory(starting={0: Start(2, NOW.mono)})
    assert abandon_stale_start(slot(0, 2, FAILED, reason="launch-failed"), starting) == [
        AbandonStart(0, 2, 2, FAILED)]
    assert abandon_stale_start(slot(0, 3, LAUNCHING), starting) == [AbandonStart(0, 2, 3, LAUNCHING)]
    assert abandon_stale_start(slot(0, 2, LAUNCHING), starting) == []  # its own generation: go on


def test_rank_of_the_running_generation_missing_is_declared_never_started_alone():
    """Fault matrix rows 2-3: the rank died while the agent was down or etcd away. Starting it into the running
    generation would make a mixed generation; the generation is declared failed instead (rank-missing)."""
    actions = launch_due(slot(1, 4, RUNNING, not_before=0.0), memory(), NOW)
    assert kinds(actions) == ["Record:rank-missing", "Declare"]
    assert actions[1] == Declare(1, 4, "rank-missing")
    assert not any(isinstance(a, Launch) for a in actions)
    # a start in progress or a teardown is not a missing rank
    assert launch_due(slot(1, 4, RUNNING), memory(starting={1: Start(4, NOW.mono)}), NOW) == []


def test_adopted_ranks_get_their_generation_from_the_first_view():
    view = DeploymentView(slots={0: SlotEntry(slot(0, 3, RUNNING, not_before=T0 - 30), 7),
                                 1: SlotEntry(slot(1, 5, LAUNCHING, not_before=T0 - 10), 8)})
    current = rank(0, generation=0, started=T0 - 29)
    leftover = rank(1, generation=0, started=T0 - 100)  # started long before generation 5 was launched
    actions = settle_adopted(view, memory(current, leftover), NOW)
    assert SetGeneration(0, 3) in actions and MarkHealthy(0, NOW.mono) in actions
    assert SetGeneration(1, 4) in actions  # a leftover of generation 4: retired, never counted as 5
    assert adopted_generation(rank(generation=0), None) == 1


def test_invalid_records_are_reported_once_per_revision():
    view = DeploymentView(invalid={"/shadowline/demo/slots/1": Invalid(12, "not JSON")})
    assert report_invalid(view, memory()) == [ReportInvalid("/shadowline/demo/slots/1", 12, "not JSON", False)]
    assert report_invalid(view, memory(reported_invalid={("/shadowline/demo/slots/1", 12)})) == []


# --- hangs ----------------------------------------------------------------------------------------------------------
def test_leader_hung_after_health_timeout_since_its_last_200():
    r = rank(healthy_at=NOW.mono - 3.2)
    actions = judge_rank(r, False, HealthAnswer(ok=False, at=NOW.mono), NOW, HANG, None)
    assert actions == [Declare(0, 1, "leader-hung")]


def test_leader_silent_for_less_than_the_timeout_is_judged_at_its_deadline():
    r = rank(healthy_at=NOW.mono - 1.0)
    actions = judge_rank(r, False, HealthAnswer(ok=False, at=NOW.mono), NOW, HANG, None)
    assert actions == [WakeAt(NOW.mono + 2.0)]
    assert health_probe_timeout(r, HANG, NOW) == 0.5
    assert abs(health_probe_timeout(rank(healthy_at=NOW.mono - 2.9), HANG, NOW) - 0.1) < 1e-6


def test_each_leader_is_probed_once_at_a_time_and_headless_or_adopted_ranks_never():
    """The loop asks a probe per leader rank with none out (the executor runs it in a thread: the loop never
    waits on an engine), with /health's timeout up to the hang deadline and the progress metrics when due."""
    due = rank(cohort=0, healthy_at=NOW.mono - 2.9, progress=Observation(70.0, NOW.mono - 1.0, True))
    due.progress_at = NOW.mono - 10.0
    fresh = rank(cohort=1, healthy_at=NOW.mono - 0.1)
    fresh.progress_at = NOW.mono
    headless = rank(cohort=2, leader=False)
    adopted = rank(cohort=3, generation=0)
    actions = leader_probes_due(memory(due, fresh, headless, adopted), HANG, NOW)
    assert [(a.cohort, a.generation, a.progress_timeout is not None) for a in actions] == [(0, 1, True), (1, 1, False)]
    assert all(isinstance(a, ProbeLeader) for a in actions)
    assert abs(actions[0].timeout - 0.1) < 1e-6 and actions[1].timeout == 0.5  # up to the hang deadline
    assert leader_probes_due(memory(due, fresh, probing={0: 1, 1: 1}), HANG, NOW) == []


def test_a_leader_that_never_answers_costs_a_probe_thread_not_the_loop():
    """observe.probe_leader (what the executor's probe thread runs) against a leader port that accepts and never
    answers: it comes back after its timeout with /health not ok and no sample, whatever else is going on."""
    import socket
    import threading
    import time

    from shadowline.control.observe import probe_leader
    from shadowline.deployment.contract import parse_contract
    from shadowline.deployment.plan_builder import build_plan

    from .helpers import hostvars

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        hv, hosts = hostvars(1, gms_engine={"tensor_parallel_size": 8}, gms_ports={"system_base": port})
        hv["node0"]["ansible_host"] = "127.0.0.1"
        contract, problems = parse_contract(hv, hosts)
        assert not problems and contract is not None, problems
        plan = build_plan(contract)
        answers: list[object] = []
        started = time.monotonic()
        thread = threading.Thread(target=lambda: answers.append(probe_leader(plan, 0, 7, 0.3, 0.5)), daemon=True)
        thread.start()
        assert not answers  # the caller goes on before the probe answers (after its 0.3 s timeout at the least)
        thread.join(5)
        (answer,) = answers
        assert answer.cohort == 0 and answer.generation == 7 and not answer.error
        assert answer.health is not None and not answer.health.ok and answer.sample is False
        assert not answer.progress_read  # /health failed: the metrics are not asked
        assert 0.25 < answer.health.at - started < 2.0


def test_slow_start_is_not_a_hang():
    """A leader that never answered 200 since its start (loading weights: 503 or nothing) is not judged."""
    loading = rank(healthy_at=None)
    assert judge_rank(loading, False, HealthAnswer(ok=False, at=NOW.mono), at(600), HANG, None) == []


def test_healthy_answer_is_remembered():
    r = rank(healthy_at=NOW.mono - 2.9)
    assert judge_rank(r, False, HealthAnswer(ok=True, at=NOW.mono), NOW, HANG, None) == [
        MarkHealthy(0, NOW.mono)]


def generating(still_s: float, tokens: float = 70.0, running: bool = True) -> LocalRank:
    """A healthy leader whose token counter last moved ``still_s`` seconds before NOW (monotonic), requests
    running (or idle)."""
    return rank(healthy_at=NOW.mono - 0.1, progress=Observation(tokens, NOW.mono - still_s, running))


OK = HealthAnswer(ok=True, at=NOW.mono)


def test_generation_stalled_from_vllms_progress_metrics_names_the_culprit():
    """Requests running, vLLM's token counter still for more than progress_stall_s, /health 200 all along (a
    worker rank stuck in a collective: vllm#16259): the leader's generation is declared stalled, the evidence
    names the signal, the node and what was seen."""
    actions = judge_rank(generating(3.5), ProgressSample(70.0, 2.0), OK, NOW, HANG, None)
    declare = actions[-1]
    assert declare == Declare(0, 1, "generation-stalled")
    assert declare.evidence["signal"] == "progress" and declare.evidence["culprit_node"] == "node0"
    assert "no token generated for 3.5 s" in declare.evidence["evidence"]
    assert kinds(actions) == ["NoteProgress", "MarkHealthy", "Declare"]
    assert kinds(judge_rank(generating(1.0), ProgressSample(70.0, 2.0), OK, NOW, HANG, None)) == [
        "NoteProgress", "MarkHealthy"]


def test_tokens_moving_idle_or_a_restarted_counter_is_never_a_stall():
    moved = judge_rank(generating(30.0), ProgressSample(71.0, 2.0), OK, NOW, HANG, None)
    assert moved[0] == NoteProgress(0, Observation(71.0, NOW.mono, True), NOW.mono) and "Declare" not in kinds(moved)
    idle = judge_rank(generating(30.0), ProgressSample(70.0, 0.0), OK, NOW, HANG, None)
    assert "Declare" not in kinds(idle)  # nothing running: only a canary finds an idle hang
    reset = judge_rank(generating(30.0), ProgressSample(5.0, 1.0), OK, NOW, HANG, None)
    assert "Declare" not in kinds(reset)
    first = judge_rank(rank(healthy_at=NOW.mono - 0.1), ProgressSample(70.0, 3.0), OK, NOW, HANG, None)
    assert first[0] == NoteProgress(0, Observation(70.0, NOW.mono, True), NOW.mono)


def test_requests_that_just_started_get_the_whole_stall_time():
    """The counter stood still while idle; requests start: their clock starts now, not when the counter last
    moved (a long idle period is no stall)."""
    idle_long = generating(600.0, running=False)
    actions = judge_rank(idle_long, ProgressSample(70.0, 1.0), OK, NOW, HANG, None)
    assert actions[0] == NoteProgress(0, Observation(70.0, NOW.mono, True), NOW.mono)
    assert "Declare" not in kinds(actions)


def test_metrics_not_read_or_without_progress_metrics_judge_health_only():
    """``False``: not read this time (or no answer): the observation is kept. ``None``: the engine has no progress
    metrics (not vLLM, still starting): noted as none."""
    assert judge_rank(generating(30.0), False, OK, NOW, HANG, None) == [MarkHealthy(0, NOW.mono)]
    assert judge_rank(generating(30.0), None, OK, NOW, HANG, None) == [
        NoteProgress(0, None, NOW.mono), MarkHealthy(0, NOW.mono)]


def test_hung_leader_evidence_names_health():
    r = rank(healthy_at=NOW.mono - 3.2)
    (declare,) = judge_rank(r, False, HealthAnswer(ok=False, at=NOW.mono), NOW, HANG, None)
    assert declare.reason == "leader-hung" and declare.evidence["signal"] == "health"
    assert declare.evidence["evidence"].startswith("/health gave no 200 for 3.2 s")


def test_a_wall_clock_step_neither_fakes_a_hang_nor_hides_one():
    """Fault matrix row 8: the wall clock steps 5 s forward or back on one node; deadlines are monotonic."""
    for step in (+5.0, -5.0):
        stepped = Now(wall=NOW.wall + step, mono=NOW.mono + 0.2)
        leader = rank(healthy_at=NOW.mono - 0.1)
        assert judge_rank(leader, False, HealthAnswer(ok=True, at=stepped.mono), stepped, HANG,
                          None) == [MarkHealthy(0, stepped.mono)]
        still = ProgressSample(70.0, 2.0)
        assert "Declare" not in kinds(judge_rank(generating(1.0), still, OK, stepped, HANG, None))
        late = Now(wall=NOW.wall + step, mono=NOW.mono + 2.6)
        assert judge_rank(generating(1.0), still, OK, late, HANG, None)[-1] == Declare(
            0, 1, "generation-stalled")  # 3.6 s still on the monotonic clock, whatever the wall says
    silent = rank(healthy_at=NOW.mono - 0.1)
    jump = Now(wall=NOW.wall + 5.0, mono=NOW.mono + 0.3)
    assert judge_rank(silent, False, HealthAnswer(ok=False, at=jump.mono), jump, HANG, None) == [
        WakeAt(NOW.mono - 0.1 + 3.0)]  # 0.4 s without a 200, not 5.4


def test_an_etcd_outage_stops_the_stall_clock_and_tears_nothing_down():
    """Fault matrix row 2b: Dynamo's engines wait on etcd too, so a counter still while etcd is away is no hang:
    each sample starts the clock afresh, nothing is declared or torn down; once etcd answers, a stall is judged
    from then."""
    isolated = judge_rank(generating(30.0), ProgressSample(70.0, 1.0), OK, NOW, HANG,
                          etcd_lost_since=NOW.mono - 30)
    assert kinds(isolated) == ["NoteProgress", "MarkHealthy"]
    assert isolated[0].observation == Observation(70.0, NOW.mono, True)  # the clock restarted
    back = rank(healthy_at=NOW.mono, progress=isolated[0].observation)
    later = at(2.0)
    still = judge_rank(back, ProgressSample(70.0, 1.0), HealthAnswer(True, later.mono), later, HANG, None)
    assert "Declare" not in kinds(still)  # 2 s since etcd returned, under progress_stall_s 3
    late = at(3.5)
    stalled = judge_rank(back, ProgressSample(70.0, 1.0), HealthAnswer(True, late.mono), late, HANG, None)
    assert kinds(stalled)[-1] == "Declare" and "TearDown" not in kinds(stalled)


def test_hang_policy_is_the_one_judgement():
    assert HANG.judge(None, None) is None
    assert HANG.judge(3.01, None) == "generation-stalled"
    assert HANG.judge(2.99, 2.99) is None
    assert HANG.judge(None, 3.0) == "leader-hung"
    assert HANG.canary_unanswered(3.01) and not HANG.canary_unanswered(2.99)
    assert HANG.progress_every_s == 0.3 and HangPolicy(2.0, 60.0).progress_every_s == 2.0
    assert HangPolicy(2.0, 1.0).progress_every_s == 0.1 and HangPolicy(2.0, 0.5).progress_every_s == 0.1


def test_the_stall_setting_keeps_long_prefills_and_slow_engines_alone():
    """False positives: a long prefill (requests running, no token for 45 s) under the default 60 s, and a slow
    but progressing engine (one token every 2.9 s under a 3 s setting), are never declared."""
    default = Failover(**{**FAILOVER.__dict__, "progress_stall_s": 60.0})
    prefill = rank(healthy_at=NOW.mono - 0.1, progress=Observation(70.0, NOW.mono - 45.0, True))
    assert "Declare" not in kinds(judge_rank(prefill, ProgressSample(70.0, 1.0), OK, NOW, HangPolicy.of(default),
                                             None))
    slow = rank(healthy_at=NOW.mono - 0.1)
    for i in range(20):
        now = at(2.9 * i)
        actions = judge_rank(slow, ProgressSample(70.0 + i, 1.0), HealthAnswer(True, now.mono), now, HANG,
                             None)
        assert "Declare" not in kinds(actions)
        slow.progress = actions[0].observation


# --- the GMS server -------------------------------------------------------------------------------------------------
def test_gms_server_death_is_reported_for_the_driver():
    assert gms_exited(NOW) == [Record("gms-lost"), ReportGmsLost(NOW.wall)]


# --- GPU faults -----------------------------------------------------------------------------------------------------
def gpu(xid: int, action: str) -> GpuFault:
    return GpuFault("GPU-aaaa", "0000:3b:00", xid, action, f"Xid {xid} (test)", "fake", T0)


def test_an_application_xid_fails_the_serving_cohorts_rank_here_at_once():
    serving, parked = rank(0, 4), rank(1, 2)
    actions = gpu_faults([gpu(31, RESTART_APP)], memory(serving, parked), Active(0, 4, T0 - 10), "node0", FAILOVER, NOW)
    assert kinds(actions) == ["Record:gpu-event", "TearDown", "Declare"]
    declare = actions[2]
    assert declare == Declare(0, 4, "gpu-xid")
    assert declare.evidence["signal"] == "gpu" and declare.evidence["gpu"] == "GPU-aaaa" and declare.evidence["xid"] == 31
    # nothing known to serve: every rank here
    assert kinds(gpu_faults([gpu(31, RESTART_APP)], memory(serving, parked), None, "node0", FAILOVER, NOW)).count(
        "Declare") == 2


def test_a_gpu_out_of_service_fails_every_rank_here_and_fences_the_node_once():
    actions = gpu_faults([gpu(79, NODE_SERVICE)], memory(rank(0, 4), rank(1, 2)), Active(0, 4, T0), "node2",
                         FAILOVER, NOW)
    assert kinds(actions) == ["Record:gpu-event", "TearDown", "Declare", "TearDown", "Declare", "Fence",
                              "Record:node-fenced"]
    assert {a.reason for a in actions if isinstance(a, Declare)} == {"gpu-fault"}
    fence = actions[5]
    assert fence.host == "node2" and fence.record["xid"] == 79 and fence.record["action"] == NODE_SERVICE
    assert "playbooks/failover.yml -e unfence=node2" in actions[6].fields["detail"]
    fenced = memory(fence=fence.record)
    assert "Fence" not in kinds(gpu_faults([gpu(79, NODE_SERVICE)], fenced, None, "node2", FAILOVER, NOW))


def test_an_xid_that_needs_nothing_is_only_recorded():
    assert kinds(gpu_faults([gpu(63, NONE)], memory(rank(0, 4)), None, "node0", FAILOVER, NOW)) == ["Record:gpu-event"]


def test_a_fence_etcd_has_not_got_is_written_again():
    record = {"xid": 79}
    assert refence(DeploymentView(), memory(fence=record), "node2") == [Fence("node2", record)]
    assert refence(DeploymentView(fenced={"node2": record}), memory(fence=record), "node2") == []
    assert refence(DeploymentView(), memory(), "node2") == []
    # once etcd had it, its absence is the operator's unfence: forgotten, so a new fault fences again
    unfenced = refence(DeploymentView(), memory(fence=record, fence_written=True), "node2")
    assert kinds(unfenced) == ["ClearFence", "Record:fence-cleared"]
