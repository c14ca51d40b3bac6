"""The driver's decisions (control/driver_duties.py), one by one: a view, observations, memory and a clock in,
actions out. No process, no etcd, no testbed."""

from __future__ import annotations

from shadowline.common.coordination import DEAD, FAILED, LAUNCHING, RUNNING, Slot
from shadowline.common.frontend import Request
from shadowline.common.lock_identity import FileId, LockSeen
from shadowline.common.policy import HangPolicy, RelaunchPolicy
from shadowline.common.progress import Observation
from shadowline.control.actions import (
    AgentBack,
    AgentLost,
    AgentsSeen,
    BeginPromotion,
    ClearGmsLost,
    Declare,
    DeferRevocation,
    EndCanary,
    EndPromotion,
    LookAtPromotion,
    NoteLaunched,
    ProbePromotion,
    ProbeServing,
    PromotionActive,
    PromotionRegistered,
    RecordActive,
    RevokeRegistration,
    SendCanary,
    SetHolder,
    SwapSlot,
    TakeBridge,
)
from shadowline.control.driver_duties import (
    PROMOTION_TIMEOUT_S,
    PromotionSeen,
    fences_reported,
    first_view,
    lock_changed,
    lock_identity,
    promotion_look_due,
    relaunch_due,
    repair_invalid,
    republish_weights,
    revoke_due,
    running_due,
    stable_due,
    unfenced_due,
    verify_promotion,
    watch_agents,
    watch_idle_serving,
)
from shadowline.control.memory import Canary, DriverMemory, NodeMemory, Promotion
from shadowline.control.view import Active, DeploymentView, Invalid, SlotEntry
from shadowline.deployment.plan import Plan

from .test_agent_node import FAILOVER, NOW, T0, at, kinds, memory, rank, slot
from .test_plan import plan_for

HOSTS = ["node0", "node1", "node2"]
POLICY = RelaunchPolicy.of(FAILOVER)


def plan() -> Plan:
    return plan_for(3, gms_engine={"tensor_parallel_size": 24})


def view(*slots: Slot, agents: tuple[str, ...] = tuple(HOSTS), gone: dict | None = None,
         gms_lost: dict[str, str] | None = None) -> DeploymentView:
    return DeploymentView(slots={s.cohort: SlotEntry(s, 10 + s.cohort) for s in slots}, agents=frozenset(agents),
                          gone=gone or {}, gms_lost=gms_lost or {}, active=None)


def completion(ok: bool, end: float = T0) -> Request:
    return Request(seq=0, start=end - 0.05, end=end, status=200 if ok else 0, ok=ok,
                   error="" if ok else "refused", end_mono=NOW.mono)


# --- the lock and the promotion ---------------------------------------------------------------------------------
def test_new_lock_holder_starts_a_promotion():
    node = memory(rank(0, 1), rank(1, 1), detected_at={(0, 1): T0 - 0.2})
    driver = DriverMemory(holder="engine-0")
    actions = lock_changed("engine-1", plan(), view(slot(0, 1, FAILED), slot(1, 1)), driver, node, NOW)
    assert kinds(actions) == ["SetHolder", "BeginPromotion", "Record:lock-acquired"]
    promotion = actions[1].promotion
    assert (promotion.cohort, promotion.generation, promotion.previous) == (1, 1, "engine-0")
    assert promotion.wake_deadline == NOW.mono + plan().failover.wake_timeout_s
    assert promotion.deadline == promotion.wake_deadline + PROMOTION_TIMEOUT_S
    assert abs(actions[2].fields["lock_s"] - 0.2) < 1e-6


def test_lock_taken_by_a_failing_generation_is_no_promotion():
    node = memory(rank(0, 1), rank(1, 1))
    actions = lock_changed("engine-1", plan(), view(slot(0, 1), slot(1, 1, FAILED)), DriverMemory(), node, NOW)
    assert kinds(actions) == ["SetHolder", "Record:lock-taken-by-failing"]


def test_lock_unchanged_or_freed():
    assert lock_changed("engine-0", plan(), view(), DriverMemory(holder="engine-0"), memory(), NOW) == []
    assert kinds(lock_changed(None, plan(), view(), DriverMemory(holder="engine-0"), memory(), NOW)) == [
        "SetHolder", "Record:lock-free"]
    assert lock_changed(None, plan(), view(), DriverMemory(holder="engine-0"), memory(), NOW)[0] == SetHolder(None)


def promotion(**kw: object) -> Promotion:
    kw.setdefault("wake_deadline", NOW.mono + 30)
    return Promotion(cohort=1, generation=1, previous="engine-0", lock_at=T0 - 0.1, deadline=NOW.mono + 60, **kw)  # type: ignore[arg-type]


def test_promotion_verified_active_then_registered_then_a_completion():
    node = memory(rank(1, 1), detected_at={(0, 1): T0 - 0.3})
    running = view(slot(0, 1, FAILED), slot(1, 1))
    p = promotion()
    driver = DriverMemory(holder="engine-1", promotion=p)
    seen = PromotionSeen(state="active", state_at=T0, leases=(0xabc,), leases_at=T0 + 0.01)
    actions = verify_promotion(running, driver, node, seen, NOW)
    assert kinds(actions) == ["PromotionActive", "PromotionRegistered", "Record:registered", "ProbePromotion"]
    assert actions[0] == PromotionActive(T0) and actions[1] == PromotionRegistered((0xabc,), T0 + 0.01)
    # the completion answered (the executor put it into the promotion): promoted
    p.active_at, p.leases, p.registered_at, p.completion = T0, [0xabc], T0 + 0.01, completion(True, T0 + 0.2)
    actions = verify_promotion(running, driver, node, PromotionSeen(), at(0.2))
    assert kinds(actions) == ["EndPromotion", "RecordActive", "Record:promoted"]
    assert actions[0] == EndPromotion(promoted=True, count="promotions_total")
    assert actions[1].cohort == 1 and abs(actions[1].promote_s - 0.5) < 1e-6


def test_promotion_waits_for_an_answer_in_flight():
    p = promotion(active_at=T0, leases=[1], probing=True)
    driver = DriverMemory(holder="engine-1", promotion=p)
    assert verify_promotion(view(slot(1, 1)), driver, memory(rank(1, 1)), PromotionSeen(), NOW) == []


def test_promotion_unverified_after_its_deadline():
    p = promotion(active_at=T0)
    driver = DriverMemory(holder="engine-1", promotion=p)
    actions = verify_promotion(view(slot(1, 1)), driver, memory(rank(1, 1)), PromotionSeen(), at(61))
    assert kinds(actions) == ["EndPromotion", "Record:promotion-unverified"]
    assert actions[1].fields["missing"] == "its registration"


def test_promotion_abandoned_when_its_generation_fails_or_the_lock_moves():
    driver = DriverMemory(holder="engine-1", promotion=promotion())
    actions = verify_promotion(view(slot(1, 1, FAILED)), driver, memory(), PromotionSeen(), NOW)
    assert kinds(actions) == ["Record:promotion-abandoned", "EndPromotion"]
    moved = DriverMemory(holder="engine-2", promotion=promotion())
    assert kinds(verify_promotion(view(slot(1, 1)), moved, memory(), PromotionSeen(), NOW))[-1] == "EndPromotion"


# --- failed slots: discovery and relaunch ----------------------------------------------------------------------
def test_registration_revoked_at_once_unless_the_serving_cohort_hands_over():
    failed = slot(1, 1, FAILED)
    assert revoke_due(view(slot(0, 1), failed), DriverMemory(serving=0), memory(), NOW) == [RevokeRegistration(1, 1)]
    # the serving cohort with a parked shadow: keep it until the successor registered (at most 10 s)
    serving_failed = slot(0, 1, FAILED, since=T0 - 1)
    driver = DriverMemory(serving=0)
    assert revoke_due(view(serving_failed, slot(1, 1)), driver, memory(), NOW) == [DeferRevocation(0, 1, T0 - 1)]
    assert revoke_due(view(serving_failed, slot(1, 1)), driver, memory(), at(9.5)) == [RevokeRegistration(0, 1)]
    assert revoke_due(view(serving_failed), DriverMemory(serving=0, revoked={(0, 1)}), memory(), NOW) == []


def test_a_deferred_revocation_outlives_the_relaunch_of_its_slot():
    """The failed serving cohort is relaunched (its slot on the next generation) before the shadow that took the
    lock registered: its dead registration is still revoked once the successor registered, not left to its
    lease's 30 s, during which the frontend routes requests to a dead worker (seen on the testbed: a client's
    request met three dead workers and got a 503)."""
    driver = DriverMemory(serving=0, promotion=promotion())
    failed = view(slot(0, 1, FAILED, since=T0 - 0.5), slot(1, 1))
    assert revoke_due(failed, driver, memory(), NOW) == [DeferRevocation(0, 1, T0 - 0.5)]
    driver.unrevoked[(0, 1)] = T0 - 0.5  # what the executor does with it
    relaunched = view(slot(0, 2, LAUNCHING), slot(1, 1))
    assert revoke_due(relaunched, driver, memory(), at(0.1)) == []  # the successor has not registered
    driver.promotion.leases = [0xabc]
    assert revoke_due(relaunched, driver, memory(), at(0.3)) == [RevokeRegistration(0, 1)]
    driver.revoked.add((0, 1))
    driver.unrevoked.clear()
    assert revoke_due(relaunched, driver, memory(), at(0.4)) == []
    # a shadow parked but never taking the lock: the deferral ends after REVOKE_DEFER_MAX_S all the same
    stale = DriverMemory(serving=0, unrevoked={(0, 1): T0 - 0.5})
    assert revoke_due(view(slot(0, 2), slot(1, 1)), stale, memory(), at(10)) == [RevokeRegistration(0, 1)]


def test_relaunch_once_every_node_confirmed_gone():
    failed = slot(1, 1, FAILED, since=T0 - 2)
    driver = DriverMemory(launched_at={(1, 1): T0 - 100})
    node = memory(detected_at={(1, 1): T0 - 2})
    partly = view(failed, gone={(1, 1): {"node0": T0 - 1.97, "node1": T0 - 1.96}})
    assert relaunch_due(failed, 11, partly, HOSTS, driver, node, POLICY, NOW) == []
    gone = view(failed, gone={(1, 1): {"node0": T0 - 1.97, "node1": T0 - 1.96, "node2": T0 - 1.95}})
    actions = relaunch_due(failed, 11, gone, HOSTS, driver, node, POLICY, NOW)
    assert kinds(actions) == ["ObserveTeardown", "Record:generation-gone", "SwapSlot"]
    assert abs(actions[0].seconds - 0.05) < 1e-6
    swap = actions[2]
    assert isinstance(swap, SwapSlot) and swap.kind == "relaunch" and swap.revision == 11
    assert (swap.slot.generation, swap.slot.state, swap.slot.attempts, swap.slot.not_before) == (2, LAUNCHING, 0, T0)


def test_relaunch_backoff_grows_on_quick_failures_then_the_slot_is_dead():
    gone = {(1, 1): {h: T0 - 1 for h in HOSTS}}
    for attempts_before, delay in ((0, 1.0), (1, 2.0), (2, 4.0)):
        failed = slot(1, 1, FAILED, since=T0 - 1, attempts=attempts_before)
        driver = DriverMemory(launched_at={(1, 1): T0 - 3})  # ran 2 s < stable_after_s: a quick failure
        swap = relaunch_due(failed, 11, view(failed, gone=gone), HOSTS, driver, memory(), POLICY, NOW)[-1]
        assert swap.kind == "relaunch" and swap.slot.attempts == attempts_before + 1
        assert swap.slot.not_before == T0 + delay
    failed = slot(1, 1, FAILED, since=T0 - 1, attempts=3)
    swap = relaunch_due(failed, 11, view(failed, gone=gone), HOSTS, DriverMemory(launched_at={(1, 1): T0 - 3}),
                        memory(), POLICY, NOW)[-1]
    assert swap.kind == "dead" and swap.slot.state == DEAD and swap.slot.attempts == 4
    assert swap.then[0].event == "slot-dead"


def test_launch_failed_counts_as_quick_and_a_long_run_resets_the_count():
    gone = {(1, 1): {h: T0 - 1 for h in HOSTS}}
    failed = slot(1, 1, FAILED, since=T0 - 1, attempts=2, reason="launch-failed")
    assert relaunch_due(failed, 11, view(failed, gone=gone), HOSTS, DriverMemory(), memory(), POLICY,
                        NOW)[-1].slot.attempts == 3
    long_run = slot(1, 1, FAILED, since=T0 - 1, attempts=2, reason="rank-exited")
    assert relaunch_due(long_run, 11, view(long_run, gone=gone), HOSTS, DriverMemory(launched_at={(1, 1): T0 - 99}),
                        memory(), POLICY, NOW)[-1].slot.attempts == 0


def test_a_promotion_is_looked_at_one_look_at_a_time_paced_until_it_is_registered():
    """The look (its leader's failover state, then its registration) runs in a thread: one out at a time, at
    most one every 50 ms, none once its registration was found (the completion through the frontend is next)."""
    driver = DriverMemory(promotion=Promotion(1, 1, "engine-0", T0, NOW.mono + 30, NOW.mono + 10))
    assert promotion_look_due(driver, NOW) == [LookAtPromotion()]
    p = driver.promotion
    p.looking, p.look_sent = True, NOW.mono
    assert promotion_look_due(driver, at(1.0)) == []  # one out
    p.looking = False
    assert promotion_look_due(driver, at(0.02)) == []  # paced
    assert promotion_look_due(driver, at(0.05)) == [LookAtPromotion()]
    p.leases = [0xabc]
    assert promotion_look_due(driver, at(1.0)) == []
    assert promotion_look_due(DriverMemory(), NOW) == []


def test_parked_relaunch_marked_running_and_a_launch_that_never_gets_healthy_fails():
    launching = slot(1, 2, LAUNCHING)
    driver = DriverMemory(launched_at={(1, 2): T0 - 1})
    node = memory(rank(1, 2, healthy_at=NOW.mono - 0.1), detected_at={(1, 1): T0 - 1.5})
    actions = running_due(launching, 12, driver, node, NOW)
    assert kinds(actions) == ["SwapSlot"] and actions[0].kind == "running" and actions[0].slot.state == RUNNING
    assert actions[0].then[0].fields["relaunch_s"] == 1.5
    booting = memory(rank(1, 2), detected_at={(1, 1): T0 - 1.5})  # no 200 from its /health yet
    assert running_due(launching, 12, driver, booting, NOW) == []
    late = running_due(launching, 12, DriverMemory(launched_at={(1, 2): T0 - 301}), booting, NOW)
    assert late == [Declare(1, 2, "launch-timeout")]
    assert running_due(launching, 12, DriverMemory(), memory(), NOW) == [NoteLaunched(1, 2, T0)]


def test_stable_generation_resets_the_crash_loop_count():
    assert stable_due(slot(1, 2, RUNNING, attempts=2, since=T0 - 31), 12, FAILOVER, NOW)[0].slot.attempts == 0
    assert stable_due(slot(1, 2, RUNNING, attempts=2, since=T0 - 5), 12, FAILOVER, NOW) == []


# --- lost agents ------------------------------------------------------------------------------------------------------
def test_agent_lost_then_back():
    driver = DriverMemory(agents_seen={"node0", "node1", "node2"}, serving=0)
    actions = watch_agents(view(slot(0, 1), agents=("node0", "node1")), "node0", driver, FAILOVER, NOW)
    assert AgentLost("node2", NOW.mono) in actions and "Record:agent-lost" in kinds(actions)
    assert ProbeServing(NOW.mono + 0.5) in actions  # serving is probed through the frontend meanwhile
    assert not any(isinstance(a, Declare) for a in actions)
    driver.agents_lost = {"node2": NOW.mono}
    back = watch_agents(view(slot(0, 1)), "node0", driver, FAILOVER, at(2))
    assert back[0] == AgentBack("node2") and back[1].fields["lost_s"] == 2.0


def test_node_lost_declared_after_serving_is_silent():
    driver = DriverMemory(agents_seen=set(HOSTS), agents_lost={"node2": NOW.mono}, serving=0,
                          serving_ok_at=NOW.mono, next_serving_probe=NOW.mono + 10)
    quiet = view(slot(0, 1), agents=("node0", "node1"))
    assert watch_agents(quiet, "node0", driver, FAILOVER, at(4.9)) == []
    actions = watch_agents(quiet, "node0", driver, FAILOVER, at(5.1))
    assert kinds(actions) == ["Record:serving-silent", "Declare"] and actions[1] == Declare(0, 1, "node-lost")


def test_new_agents_are_remembered():
    assert watch_agents(view(agents=("node0", "node1")), "node0", DriverMemory(), FAILOVER, NOW) == [
        AgentsSeen(frozenset({"node0", "node1"}))]


# --- GMS server death --------------------------------------------------------------------------------------------
def test_gms_lost_while_the_writer_serves_fails_it_over_to_a_parked_shadow():
    lost = {"node1": "/shadowline/demo/gms_lost/node1"}
    actions = republish_weights(view(slot(0, 3), slot(1, 1), gms_lost=lost), DriverMemory(holder="engine-0"))
    assert kinds(actions) == ["Record:gms-republish", "Declare", "ClearGmsLost"]
    assert actions[1] == Declare(0, 3, "gms-republish")
    assert actions[2] == ClearGmsLost(("/shadowline/demo/gms_lost/node1",))


def test_gms_lost_without_a_parked_shadow_leaves_serving_alone():
    lost = {"node0": "k"}
    actions = republish_weights(view(slot(0, 1), slot(1, 1, FAILED), gms_lost=lost), DriverMemory(holder="engine-0"))
    assert kinds(actions) == ["Record:gms-degraded", "ClearGmsLost"]
    assert republish_weights(view(slot(0, 1)), DriverMemory()) == []


def test_gms_lost_while_the_writer_relaunches_already():
    actions = republish_weights(view(slot(0, 2, LAUNCHING), gms_lost={"node0": "k"}), DriverMemory())
    assert kinds(actions) == ["Record:gms-republish", "ClearGmsLost"]


def test_active_record_parses():
    assert Active(1, 2, T0).cohort == 1
    assert isinstance(BeginPromotion(promotion()).promotion, Promotion)
    assert RecordActive(1, 2, None).promote_s is None and NodeMemory().ranks == {}
    assert ProbePromotion() == ProbePromotion()


# --- waking, first view, broken records (fault matrix rows 1 and 10) ----------------------------------------------
def test_a_shadow_that_hangs_while_waking_is_failed_so_the_next_takes_over():
    """Row 10: the lock holder never becomes active; past wake_timeout_s it is declared failed (wake-timeout),
    which kills it on every node and frees the lock for the next parked shadow."""
    driver = DriverMemory(holder="engine-1", promotion=promotion(wake_deadline=NOW.mono - 0.01))
    actions = verify_promotion(view(slot(0, 1, FAILED), slot(1, 1)), driver, memory(rank(1, 1)),
                               PromotionSeen(state="waking"), NOW)
    assert kinds(actions) == ["EndPromotion", "Record:wake-timeout", "Declare"]
    assert actions[-1].reason == "wake-timeout" and (actions[-1].cohort, actions[-1].generation) == (1, 1)
    # before its deadline, or once active, it is left to finish
    early = DriverMemory(holder="engine-1", promotion=promotion(wake_deadline=NOW.mono + 1))
    assert "Declare" not in kinds(verify_promotion(view(slot(1, 1)), early, memory(rank(1, 1)),
                                                   PromotionSeen(state="waking"), NOW))
    awake = DriverMemory(holder="engine-1", promotion=promotion(wake_deadline=NOW.mono - 1, active_at=T0 - 0.5))
    assert "Declare" not in kinds(verify_promotion(view(slot(1, 1)), awake, memory(rank(1, 1)), PromotionSeen(),
                                                   NOW))


def test_first_view_creates_missing_slots_once():
    node = memory(rank(0, 1))
    actions = first_view(view(slot(2, 4)), [0, 1, 2], DriverMemory(), node)
    assert kinds(actions) == ["SetServing", "CreateSlot", "CreateSlot"]
    assert (actions[1].slot.cohort, actions[1].slot.state) == (0, RUNNING)
    assert (actions[2].slot.cohort, actions[2].slot.state, actions[2].slot.reason) == (1, LAUNCHING, "not running")
    assert first_view(view(), [0, 1, 2], DriverMemory(adopted=True), node) == []


def test_broken_slot_records_are_repaired_never_acted_on():
    """Row 1: a record that does not parse is replaced (compare-and-swap on its revision): by the running
    generation when the driver's rank runs, else by a new generation launched everywhere. A record from a newer
    shadowline, or of a cohort outside the plan, is left alone."""
    broken = DeploymentView(invalid={
        "/shadowline/demo/slots/0": Invalid(21, "not JSON"),
        "/shadowline/demo/slots/1": Invalid(22, "state is 'exploded'"),
        "/shadowline/demo/slots/2": Invalid(23, "schema 9 is newer", newer=True),
        "/shadowline/demo/slots/7": Invalid(24, "cohort 7 is not in the plan"),
    }, gone={(1, 3): {"node0": T0}})
    actions = repair_invalid(broken, [0, 1, 2], memory(rank(0, 5)), NOW)
    assert kinds(actions) == ["SwapSlot", "SwapSlot"]
    running, relaunch = actions[0], actions[1]
    assert (running.slot.cohort, running.slot.generation, running.slot.state, running.revision) == (0, 5, RUNNING, 21)
    assert (relaunch.slot.cohort, relaunch.slot.generation, relaunch.slot.state, relaunch.revision) == (
        1, 4, LAUNCHING, 22)


# --- the lock file deleted while held (fault matrix row 11) -------------------------------------------------------
OLD, NEW = FileId(45, 100), FileId(45, 200)


def test_lock_file_replaced_while_held_bridges_and_moves_the_shadows():
    """The serving engine (cohort 0) holds the old file; the path now names a new one. The driver takes the new
    file itself (in engine 0's name), and the parked shadow still waiting on the old file is failed (relaunched
    onto the new file, behind the bridge)."""
    seen = LockSeen(path=NEW, holders={0: OLD}, waiting={1: OLD})
    actions = lock_identity(seen, view(slot(0, 1), slot(1, 2)), DriverMemory(serving=0), {0: 0, 1: 1}, NOW)
    assert kinds(actions) == ["NoteLockReplaced", "Record:lock-replaced", "Record:lock-replaced", "Declare",
                              "TakeBridge"]
    assert Declare(1, 2, "lock-replaced") in actions and TakeBridge(0) in actions
    # an engine that won the new file anyway: a second holder, failed; no bridge while it holds the file
    split = LockSeen(path=NEW, holders={0: OLD, 1: NEW}, waiting={})
    actions = lock_identity(split, view(slot(0, 1), slot(1, 2)), DriverMemory(serving=0, lock_replaced_at=T0),
                            {0: 0, 1: 1}, NOW)
    assert kinds(actions) == ["Record:lock-split", "Declare"] and actions[1] == Declare(1, 2, "lock-split")


def test_the_bridge_goes_when_the_serving_engine_lets_its_lock_go():
    moved = LockSeen(path=NEW, holders={}, waiting={1: NEW})
    assert kinds(lock_identity(moved, view(slot(1, 3)), DriverMemory(serving=0, bridge=object()), {0: 0, 1: 1},
                               NOW)) == ["ReleaseBridge", "Record:lock-bridge-released"]
    whole = LockSeen(path=OLD, holders={0: OLD}, waiting={1: OLD})
    assert lock_identity(whole, view(slot(0, 1), slot(1, 1)), DriverMemory(serving=0), {0: 0, 1: 1}, NOW) == []


def test_the_first_holder_waits_for_its_slot():
    """At the driver's start the lock holder is seen before its slot is created: no verdict until it exists, so the
    first holder's promotion is verified and the driver learns which cohort serves."""
    assert lock_changed("engine-0", plan(), view(), DriverMemory(), memory(rank(0, 1)), NOW) == []
    assert lock_changed("engine-0", plan(), view(slot(0, 1)), DriverMemory(), memory(rank(0, 0)), NOW) == []
    assert "BeginPromotion" in kinds(lock_changed("engine-0", plan(), view(slot(0, 1)), DriverMemory(),
                                                  memory(rank(0, 1)), NOW))


# --- the canary: an idle hang ----------------------------------------------------------------------------------
HANG = HangPolicy.of(FAILOVER)  # progress_stall_s 3, canary_interval_s 1


def idle_leader(tokens: float = 70.0, running: bool = False) -> NodeMemory:
    return memory(rank(0, 1, healthy_at=NOW.mono, progress=Observation(tokens, NOW.mono, running)))


def test_a_canary_goes_to_the_idle_serving_cohort_when_due():
    driver = DriverMemory(serving=0)
    actions = watch_idle_serving(view(slot(0, 1)), driver, idle_leader(), HANG, FAILOVER, NOW)
    assert actions == [SendCanary(0, 1, NOW.mono, 70.0, NOW.mono + FAILOVER.canary_interval_s)]
    # busy (requests running): the token counter judges; not due yet; nothing serving; a promotion going on
    assert watch_idle_serving(view(slot(0, 1)), driver, idle_leader(running=True), HANG, FAILOVER, NOW) == []
    later = DriverMemory(serving=0, next_canary=NOW.mono + 0.5)
    assert watch_idle_serving(view(slot(0, 1)), later, idle_leader(), HANG, FAILOVER, NOW) == []
    assert watch_idle_serving(view(slot(0, 1)), DriverMemory(), idle_leader(), HANG, FAILOVER, NOW) == []
    promoting = DriverMemory(serving=0, promotion=Promotion(1, 1, "engine-0", T0, NOW.mono + 60, NOW.mono + 5))
    assert watch_idle_serving(view(slot(0, 1)), promoting, idle_leader(), HANG, FAILOVER, NOW) == []


def test_an_unanswered_canary_declares_the_serving_generation_and_names_it():
    driver = DriverMemory(serving=0, canary=Canary(0, 1, NOW.mono - 3.2, 70.0))
    actions = watch_idle_serving(view(slot(0, 1)), driver, idle_leader(), HANG, FAILOVER, NOW)
    assert actions == [EndCanary(), Declare(0, 1, "canary-unanswered")]
    assert actions[1].evidence["signal"] == "canary" and actions[1].evidence["culprit_node"] == "node0"
    waiting = DriverMemory(serving=0, canary=Canary(0, 1, NOW.mono - 2.5, 70.0))
    assert watch_idle_serving(view(slot(0, 1)), waiting, idle_leader(), HANG, FAILOVER, NOW) == []


def test_an_unanswered_canary_leaves_a_leader_silent_on_health_to_its_health_verdict():
    """hang-leader with both timeouts alike (the drills'): the frozen leader's /health and the canary go silent
    together; the declaration is the health signal's (leader-hung, judge_rank), not a race the canary may win."""
    sent = NOW.mono - 3.2  # unanswered: progress_stall_s 3
    for last_200, verdict in ((NOW.mono - 0.1, True), (NOW.mono - 1.4, True), (NOW.mono - 1.6, False),
                              (NOW.mono - 3.9, False), (NOW.mono - 4.1, True)):
        leader = memory(rank(0, 1, healthy_at=last_200, progress=Observation(70.0, NOW.mono, False)))
        actions = watch_idle_serving(view(slot(0, 1)), DriverMemory(serving=0, canary=Canary(0, 1, sent, 70.0)),
                                     leader, HANG, FAILOVER, NOW)
        # answering /health (silent under half health_timeout_s 3): the canary's; silent for longer: left to the
        # health verdict until HEALTH_VERDICT_S past its deadline, when the canary declares after all
        assert [type(a).__name__ for a in actions] == (["EndCanary", "Declare"] if verdict else []), (last_200, actions)
        assert not verdict or actions[1].reason == "canary-unanswered"


def test_a_canary_is_no_verdict_when_tokens_moved_it_failed_or_serving_changed():
    slow = DriverMemory(serving=0, canary=Canary(0, 1, NOW.mono - 3.2, 70.0))
    assert watch_idle_serving(view(slot(0, 1)), slow, idle_leader(tokens=71.0), HANG, FAILOVER, NOW) == [EndCanary()]
    refused = DriverMemory(serving=0, canary=Canary(0, 1, NOW.mono - 0.1, 70.0, answer=completion(False)))
    actions = watch_idle_serving(view(slot(0, 1)), refused, idle_leader(), HANG, FAILOVER, NOW)
    assert kinds(actions) == ["EndCanary", "Record:canary-failed"]
    answered = DriverMemory(serving=0, canary=Canary(0, 1, NOW.mono - 0.1, 70.0, answer=completion(True)))
    assert watch_idle_serving(view(slot(0, 1)), answered, idle_leader(), HANG, FAILOVER, NOW) == [EndCanary()]
    moved_on = DriverMemory(serving=1, canary=Canary(0, 1, NOW.mono - 9.0, 70.0))
    assert watch_idle_serving(view(slot(0, 1), slot(1, 1)), moved_on, idle_leader(), HANG, FAILOVER, NOW) == [
        EndCanary()]
    relaunched = DriverMemory(serving=0, canary=Canary(0, 1, NOW.mono - 9.0, 70.0))
    assert watch_idle_serving(view(slot(0, 2)), relaunched, idle_leader(), HANG, FAILOVER, NOW) == [EndCanary()]


# --- a fenced node (a GPU out of service) ---------------------------------------------------------------------------
FENCE = {"gpu": "GPU-aaaa", "xid": 79, "action": "node-service", "detail": "Xid 79 (test)"}


def test_a_fenced_node_holds_every_relaunch_and_says_so_once():
    failed = slot(1, 1, FAILED, since=T0 - 1)
    fenced = DeploymentView(slots={1: SlotEntry(failed, 11)}, gone={(1, 1): {h: T0 - 1 for h in HOSTS}},
                            fenced={"node2": FENCE})
    swap = relaunch_due(failed, 11, fenced, HOSTS, DriverMemory(), memory(), POLICY, NOW)[-1]
    assert swap.kind == "dead" and (swap.slot.state, swap.slot.reason) == (DEAD, "node-fenced")
    assert swap.then[0].event == "slot-held"
    driver = DriverMemory()
    said = fences_reported(fenced, driver)
    assert kinds(said) == ["Record:serving-needs-hardware", "NoteFences"]
    assert "-e unfence=node2" in said[0].fields["detail"] and said[0].fields["xid"] == 79
    assert fences_reported(fenced, DriverMemory(fences_reported={"node2"})) == []
    reported = fences_reported(view(), DriverMemory(fences_reported={"node2"}))
    assert kinds(reported) == ["Record:unfenced", "NoteFences"]


def test_held_slots_relaunch_by_themselves_once_no_node_is_fenced():
    held = slot(1, 1, DEAD, reason="node-fenced", attempts=2)
    still = DeploymentView(slots={1: SlotEntry(held, 11)}, fenced={"node2": FENCE})
    assert unfenced_due(held, 11, still, NOW) == []
    (swap,) = unfenced_due(held, 11, view(held), NOW)
    assert swap.kind == "relaunch" and (swap.slot.generation, swap.slot.state, swap.slot.attempts) == (2, LAUNCHING, 0)
    crash_loop = slot(1, 1, DEAD, reason="crash-loop")
    assert unfenced_due(crash_loop, 11, view(crash_loop), NOW) == []  # a crash loop waits for the operator
