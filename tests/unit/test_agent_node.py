"""The node agent's decisions (control/node_duties.py), one by one: a view, observations, memory and a clock in,
actions out. No process, no etcd, no testbed."""

from __future__ import annotations

from shadowline.control.actions import (
    AbandonStart,
    Confirm,
    Declare,
    FinishTeardown,
    KillRest,
    Launch,
    Launched,
    LaunchFailed,
    MarkHealthy,
    NoteDetected,
    NoteProgress,
    Record,
    ReportGmsLost,
    ReportInvalid,
    SetGeneration,
    TearDown,
    WakeAt,
)
from shadowline.control.coordination import DEAD, FAILED, LAUNCHING, RUNNING, Slot
from shadowline.control.memory import LocalRank, NodeMemory, ProgressMark, Start, Teardown
from shadowline.control.node_duties import (
    abandon_stale_start,
    adopted_generation,
    gms_exited,
    health_probe_timeout,
    judge_rank,
    launch_due,
    rank_exited,
    report_invalid,
    retire_leftover,
    settle_adopted,
    settle_failed,
    slot_failed,
    start_progress,
    teardowns_due,
)
from shadowline.control.observe import HealthAnswer, UnitState
from shadowline.control.policy import HangPolicy
from shadowline.control.view import DeploymentView, Invalid, Now, SlotEntry
from shadowline.deployment.contract import Failover

FAILOVER = Failover(health_timeout_s=3.0, heartbeat_stall_s=3.0, term_grace_s=0.0, planned_grace_s=5.0,
                    agent_lease_ttl_s=3, relaunch_backoff_s=1.0, relaunch_backoff_max_s=30.0,
                    max_relaunch_attempts=3, stable_after_s=30.0, wake_timeout_s=5.0)
HANG = HangPolicy.of(FAILOVER)
T0 = 1_700_000_000.0  # wall clock of the tests' "now"
NOW = Now(wall=T0, mono=5000.0)


def at(seconds: float) -> Now:
    """The clock ``seconds`` after NOW."""
    return Now(wall=NOW.wall + seconds, mono=NOW.mono + seconds)


def rank(cohort: int = 0, generation: int = 1, leader: bool = True, healthy_at: float | None = None,
         started: float = T0 - 60, progress: ProgressMark | None = None) -> LocalRank:
    return LocalRank(cohort=cohort, generation=generation, unit=f"shadowline-demo-engine@{cohort}.service",
                     pid=4242 + cohort, pidfd=None, cgroup=f"/system.slice/engine@{cohort}", leader=leader,
                     started=started, healthy_at=healthy_at, progress=progress)


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
    actions = judge_rank(r, None, HealthAnswer(ok=False, at=NOW.mono), NOW, HANG, FAILOVER, None)
    assert actions == [Declare(0, 1, "leader-hung")]


def test_leader_silent_for_less_than_the_timeout_is_judged_at_its_deadline():
    r = rank(healthy_at=NOW.mono - 1.0)
    actions = judge_rank(r, None, HealthAnswer(ok=False, at=NOW.mono), NOW, HANG, FAILOVER, None)
    assert actions == [WakeAt(NOW.mono + 2.0)]
    assert health_probe_timeout(r, HANG, NOW) == 0.5
    assert abs(health_probe_timeout(rank(healthy_at=NOW.mono - 2.9), HANG, NOW) - 0.1) < 1e-6


def test_slow_start_is_not_a_hang():
    """A leader that never answered 200 since its start (loading weights: 503 or nothing) is not judged."""
    loading = rank(healthy_at=None)
    assert judge_rank(loading, None, HealthAnswer(ok=False, at=NOW.mono), at(600), HANG, FAILOVER, None) == []
    # a progress signal seen for the first time (e.g. a leftover file of an earlier generation) is not a stall:
    # only a signal seen moving is judged
    first = judge_rank(rank(leader=False), T0 - 100, None, NOW, HANG, FAILOVER, None)
    assert first == [NoteProgress(0, ProgressMark(T0 - 100, NOW.mono, moved=False))]
    unmoved = rank(leader=False, progress=ProgressMark(T0 - 100, NOW.mono - 60, moved=False))
    assert judge_rank(unmoved, T0 - 100, None, NOW, HANG, FAILOVER, None) == []


def test_healthy_answer_is_remembered():
    r = rank(healthy_at=NOW.mono - 2.9)
    assert judge_rank(r, None, HealthAnswer(ok=True, at=NOW.mono), NOW, HANG, FAILOVER, None) == [
        MarkHealthy(0, NOW.mono)]


def moving(since_s: float, value: float = 7.0) -> LocalRank:
    """A worker whose progress signal last moved ``since_s`` seconds before NOW (monotonic)."""
    return rank(leader=False, progress=ProgressMark(value, NOW.mono - since_s, moved=True))


def test_worker_stalled_by_its_progress_signal():
    assert judge_rank(moving(3.5), 7.0, None, NOW, HANG, FAILOVER, None) == [Declare(0, 1, "collective-stalled")]
    assert judge_rank(moving(1.0), 7.0, None, NOW, HANG, FAILOVER, None) == []
    # a step of the signal is progress, noted on the monotonic clock
    assert judge_rank(moving(3.5), 8.0, None, NOW, HANG, FAILOVER, None) == [
        NoteProgress(0, ProgressMark(8.0, NOW.mono, moved=True))]


def test_a_wall_clock_step_neither_fakes_a_hang_nor_hides_one():
    """Fault matrix row 8: the wall clock steps 5 s forward or back on one node; deadlines are monotonic."""
    for step in (+5.0, -5.0):
        stepped = Now(wall=NOW.wall + step, mono=NOW.mono + 0.2)
        leader = rank(healthy_at=NOW.mono - 0.1)
        assert judge_rank(leader, None, HealthAnswer(ok=True, at=stepped.mono), stepped, HANG, FAILOVER,
                          None) == [MarkHealthy(0, stepped.mono)]
        assert judge_rank(moving(1.0), 7.0, None, stepped, HANG, FAILOVER, None) == []  # 1.2 s of silence
        late = Now(wall=NOW.wall + step, mono=NOW.mono + 2.6)
        assert judge_rank(moving(1.0), 7.0, None, late, HANG, FAILOVER, None) == [
            Declare(0, 1, "collective-stalled")]  # 3.6 s of silence on the monotonic clock, whatever the wall says


def test_fencing_isolated_node_with_stalled_collective_tears_down_locally():
    worker = moving(4.0)
    actions = judge_rank(worker, 7.0, None, NOW, HANG, FAILOVER, etcd_lost_since=NOW.mono - 3.5)
    assert kinds(actions) == ["Declare", "Record:fenced", "TearDown"]
    assert actions[2] == TearDown(worker, NOW.wall, 0.0)


def test_no_fencing_when_etcd_is_lost_but_the_collective_progresses_or_not_long_enough():
    assert judge_rank(moving(0.5), 7.0, None, NOW, HANG, FAILOVER, etcd_lost_since=NOW.mono - 30) == []
    assert kinds(judge_rank(moving(4.0), 7.0, None, NOW, HANG, FAILOVER, etcd_lost_since=NOW.mono - 1)) == [
        "Declare"]


def test_hang_policy_is_the_one_judgement():
    assert HANG.judge(None, None) is None
    assert HANG.judge(3.01, None) == "collective-stalled"
    assert HANG.judge(2.99, 2.99) is None
    assert HANG.judge(None, 3.0) == "leader-hung"


# --- the GMS server -------------------------------------------------------------------------------------------------
def test_gms_server_death_is_reported_for_the_driver():
    assert gms_exited(NOW) == [Record("gms-lost"), ReportGmsLost(NOW.wall)]
