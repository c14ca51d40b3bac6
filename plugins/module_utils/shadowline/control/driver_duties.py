"""What the driver (the agent on node rank 0, where every cohort's leader and the failover lock live) decides,
as pure functions of (the deployment view, its observations, its memory, the clock) returning actions; and
DriverDuties, which observes, calls them and hands their actions to the executor.

Duties: notice a new lock holder and verify its promotion (active, registered, a completion through the
frontend), then record it active; take a failed cohort out of discovery; relaunch a failed slot once every node
confirmed its ranks gone (RelaunchPolicy: backoff, crash loop -> dead); mark a parked relaunch running; watch
the other agents (lost/back, the serving probe, node-lost); send canaries to an idle serving cohort (an idle hang
shows in no metric); have the writer republish after a GMS server died.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..cluster.cohort_state import lock_holder
from ..common.coordination import DEAD, FAILED, LAUNCHING, RUNNING, Slot
from ..common.lock import parse_holder
from ..common.lock_identity import LockSeen, lock_seen
from ..common.policy import (
    CANARY_UNANSWERED,
    MIXED_CONFIGURATION,
    NODE_FENCED,
    REPUBLISH,
    REPUBLISH_UNDER_WAY,
    HangPolicy,
    RelaunchPolicy,
    republish_choice,
    silence,
)
from ..common.proc import cgroup_pids
from ..common.settings import Failover
from ..deployment.plan import Plan
from . import observe
from .actions import (
    Action,
    AgentBack,
    AgentLost,
    AgentsSeen,
    BeginPromotion,
    ClearGmsLost,
    CreateSlot,
    Declare,
    DeferRevocation,
    EndCanary,
    EndPromotion,
    ExtendPromotion,
    LookAtPromotion,
    NoteFences,
    NoteLaunched,
    NoteLockReplaced,
    NoteMixed,
    ObserveTeardown,
    ProbePromotion,
    ProbeServing,
    PromotionActive,
    PromotionRegistered,
    Record,
    RecordActive,
    RefreshLeases,
    ReleaseBridge,
    RevokeRegistration,
    SendCanary,
    SetHolder,
    SetServing,
    SwapSlot,
    TakeBridge,
)
from .memory import Canary, DriverMemory, NodeMemory, Promotion, PromotionSeen
from .view import DeploymentView, Now

PROMOTION_LOOK_S = 0.05  # a promotion being verified is looked at this often (the loop's tick while it lasts)
LAUNCH_TIMEOUT_S = 300.0  # a launched generation whose leader never gets healthy is declared failed
PROMOTION_TIMEOUT_S = 60.0  # lock taken -> active, registered and serving through the frontend (after waking)
REVOKE_DEFER_MAX_S = 10.0  # longest the serving cohort's registration is kept while its successor wakes
REVOKE_RETRY_S = 1.0  # a revocation etcd refused or did not answer is tried again this often (while it answers)
SERVING_PROBE_S = 0.5  # while a node's agent is lost: how often the driver sends a completion through the frontend
SERVING_SILENT_EXTRA_S = 2.0  # the probe's request timeout, on top of health_timeout_s


def rounded(value: float | None, digits: int = 4) -> float | None:
    return round(value, digits) if value is not None else None


def failure_of(holder: str | None, detected_at: dict[tuple[int, int], float]) -> float | None:
    """When the latest failure of lock holder ``holder``'s cohort was declared (None: none known)."""
    cohort = parse_holder(holder or "")
    failed = [t for (c, _g), t in detected_at.items() if cohort is not None and c == cohort]
    return max(failed) if failed else None


# --- the lock and the promotion --------------------------------------------------------------------------------
def lock_changed(holder: str | None, plan: Plan, view: DeploymentView | None, driver: DriverMemory,
                 node: NodeMemory, now: Now) -> list[Action]:
    """A new lock holder (read every tick): start verifying its promotion, unless its generation is failing."""
    if holder == driver.holder:
        return []
    previous = driver.holder if driver.holder is not None else driver.last_holder
    actions: list[Action] = [SetHolder(holder)]
    if holder is None:
        return actions + [Record("lock-free", fields={"previous": previous})]
    cohort = parse_holder(holder)
    if cohort is None or not plan.has_cohort(cohort):
        return actions + [Record("lock-unknown-holder", fields={"holder": holder})]
    rank = node.ranks.get(cohort)
    slot = view.slot(cohort) if view else None
    if slot is None or (rank is not None and not rank.generation):
        return []  # its slot not created, or its rank's generation not known yet: look again next tick
    if rank is None or slot.state in (FAILED, DEAD) or rank.generation != slot.generation:
        # e.g. a shadow whose own generation is being torn down grabbed the lock on its way out
        return actions + [Record("lock-taken-by-failing", cohort, rank.generation if rank else None,
                                 {"holder": holder,
                                  "slot": f"{slot.state} generation {slot.generation}" if slot else None})]
    detected = failure_of(previous, node.detected_at)
    lock_s = now.wall - detected if detected is not None else None
    wake = float(plan.failover.wake_timeout_s)
    promotion = Promotion(cohort=cohort, generation=rank.generation, previous=previous, lock_at=now.wall,
                          deadline=now.mono + wake + PROMOTION_TIMEOUT_S, wake_deadline=now.mono + wake)
    return actions + [BeginPromotion(promotion),
                      Record("lock-acquired", cohort, rank.generation, {"previous": previous, "lock_s": rounded(lock_s)})]


def verify_promotion(view: DeploymentView, driver: DriverMemory, node: NodeMemory, seen: PromotionSeen,
                     now: Now) -> list[Action]:
    """The new holder is promoted when its failover state is active, its registration is in discovery and a
    completion goes through the frontend; then it is recorded active (and its predecessor's registration can go)."""
    p = driver.promotion
    if p is None:
        return []
    slot = view.slot(p.cohort)
    if driver.holder != f"engine-{p.cohort}" or slot is None or slot.state in (FAILED, DEAD) \
            or slot.generation != p.generation:
        return [Record("promotion-abandoned", p.cohort, p.generation,
                       {"holder": driver.holder, "slot": slot.state if slot else None}),
                EndPromotion()]
    actions: list[Action] = []
    active_at = p.active_at
    if active_at is None and seen.state == "active":
        active_at = seen.state_at
        actions.append(PromotionActive(seen.state_at))
    leases = p.leases
    if active_at is not None and not leases and seen.leases:
        leases = list(seen.leases)
        actions += [PromotionRegistered(seen.leases, seen.leases_at),
                    Record("registered", p.cohort, p.generation, {"leases": [f"{x:x}" for x in seen.leases]})]
    if leases and not p.probing:
        if p.completion is not None and p.completion.ok:
            return actions + promoted(p, active_at, node)
        actions.append(ProbePromotion())
    if active_at is None and now.mono > p.wake_deadline:  # hung while waking: it keeps the lock from the rest
        return actions + [EndPromotion(count="promotions_unverified_total"),
                          Record("wake-timeout", p.cohort, p.generation, {
                              "waited_s": round(now.wall - p.lock_at, 3), "state": seen.state,
                              "detail": "the lock holder is not active; failed, so the next shadow takes over"}),
                          Declare(p.cohort, p.generation, "wake-timeout")]
    if now.mono > p.deadline:
        missing = "its active state" if active_at is None else "its registration" if not leases \
            else f"a completion through the frontend ({p.completion.error if p.completion else 'no answer'})"
        actions += [EndPromotion(count="promotions_unverified_total"),
                    Record("promotion-unverified", p.cohort, p.generation,
                           {"missing": missing, "waited_s": round(now.wall - p.lock_at, 3)})]
    return actions


def promotion_look_due(driver: DriverMemory, now: Now) -> list[Action]:
    """A look at the promoted cohort (its failover state, then its registration: an HTTP read of its leader and
    an etcd read, in a thread) while either is still to be found, none is out and none went out in the last
    PROMOTION_LOOK_S; its answer wakes the loop, which verifies at once."""
    p = driver.promotion
    if p is None or p.leases or p.looking or now.mono - p.look_sent < PROMOTION_LOOK_S:
        return []
    return [LookAtPromotion()]


def promoted(p: Promotion, active_at: float | None, node: NodeMemory) -> list[Action]:
    detected = failure_of(p.previous, node.detected_at)
    end = p.completion.end if p.completion else None
    promote_s = end - detected if end is not None and detected is not None else None
    return [EndPromotion(promoted=True, count="promotions_total"),
            RecordActive(p.cohort, p.generation, promote_s),
            Record("promoted", p.cohort, p.generation, {
                "previous": p.previous, "state": "active", "promote_s": rounded(promote_s),
                "lock_s": rounded(p.lock_at - detected) if detected is not None else None,
                "active_s": rounded(active_at - p.lock_at) if active_at else None,
                "registered_s": rounded(p.registered_at - p.lock_at) if p.registered_at else None,
                "completion_s": rounded(end - p.lock_at) if end is not None else None})]


def lock_identity(seen: LockSeen, view: DeploymentView, driver: DriverMemory, engine_ids: dict[int, int],
                  now: Now) -> list[Action]:
    """A flock belongs to a file, not a path: the lock file deleted (or replaced) while the serving engine holds it
    leaves the serving engine locking a file no path names, and the next engine to open the path would win a new
    file's lock at once (two active engines). So: the driver takes the path's file itself in the serving engine's
    name (the bridge); an engine that holds it anyway is failed (lock-split), and parked shadows still waiting
    on the old file are failed (lock-replaced) and relaunched onto the path's file, behind the bridge. Once the
    serving engine lets the old file go (it failed, or was failed over), the bridge is released and one shadow
    wins the path's file: one holder again."""
    serving = driver.serving
    held = seen.holders.get(serving) if serving is not None else None
    if held is None:
        return [ReleaseBridge(), Record("lock-bridge-released")] if driver.bridge is not None else []
    if seen.path == held:
        return []
    actions: list[Action] = []
    if driver.lock_replaced_at is None:
        actions += [NoteLockReplaced(now.wall), Record("lock-replaced", serving, None, {
            "detail": "the lock file was deleted or replaced while held; shadows are moved onto the new file"})]
    others = {c for c in seen.holders if c != serving}
    for cohort in sorted(others | {c for c, f in seen.waiting.items() if c != serving and f != seen.path}):
        slot = view.slot(cohort)
        if slot is not None and slot.state in (RUNNING, LAUNCHING):
            reason = "lock-split" if cohort in others else "lock-replaced"
            actions += [Record(reason, cohort, slot.generation), Declare(cohort, slot.generation, reason)]
    if driver.bridge is None and not others and serving in engine_ids:
        actions.append(TakeBridge(engine_ids[serving]))
    return actions


# --- failed slots: out of discovery, relaunch ------------------------------------------------------------------
def revoke_due(view: DeploymentView, driver: DriverMemory, node: NodeMemory, now: Now) -> list[Action]:
    """Take each failed generation out of discovery, so the frontend stops routing to it: at once, unless it was
    the serving cohort and a shadow is taking over. Then the dead registration stays until the successor has
    registered (at most REVOKE_DEFER_MAX_S): the frontend keeps the model and retries a request that meets the
    dead worker on the new one (request migration); revoked earlier, the frontend would drop the model and
    answer 404 until it has loaded the successor's model card again.

    A deferred revocation is remembered apart from the slot (``DeferRevocation``): the failed slot may be
    relaunched before the successor registered, and its next generation must not make the dead registration
    wait for its lease to run out (30 s): the frontend keeps routing there, each request it sends there is one
    migration, and a client whose request meets three dead workers gets a 503. A revocation that etcd refused or
    did not answer is kept the same way and tried again every REVOKE_RETRY_S."""
    failed = {(e.slot.cohort, e.slot.generation): e.slot.since for e in view.slots.values() if e.slot.state == FAILED}
    actions: list[Action] = []
    for (cohort, generation), since in sorted({**failed, **driver.unrevoked}.items()):
        if (cohort, generation) in driver.revoked \
                or now.wall - driver.revoke_failed_at.get((cohort, generation), 0.0) < REVOKE_RETRY_S:
            continue
        detected = node.detected_at.get((cohort, generation), since)
        if cohort == driver.serving and now.wall - detected < REVOKE_DEFER_MAX_S and handing_over(cohort, view, driver):
            if (cohort, generation) not in driver.unrevoked:
                actions.append(DeferRevocation(cohort, generation, since))
            continue
        actions.append(RevokeRegistration(cohort, generation))
    return actions


def handing_over(cohort: int, view: DeploymentView, driver: DriverMemory) -> bool:
    """Whether another cohort is taking over from ``cohort`` and has not registered yet: it woke, or one is
    parked and nobody holds the lock yet."""
    p = driver.promotion
    if p is not None:
        return p.cohort != cohort and not p.leases
    return any(c != cohort and e.slot.state == RUNNING for c, e in view.slots.items())


def ran_for(slot: Slot, driver: DriverMemory) -> float | None:
    """How long the failed generation ran before it failed: None when it never started; unknown (launched
    before this driver, e.g. adopted) counts as long."""
    if slot.reason in ("launch-failed", "launch-timeout"):
        return None
    launched = driver.launched_at.get((slot.cohort, slot.generation))
    return slot.since - launched if launched is not None else float("inf")


def relaunch_due(slot: Slot, revision: int, view: DeploymentView, hosts: list[str], driver: DriverMemory,  # noqa: PLR0913 (the view, the memories, the policy and one observation)
                 node: NodeMemory, policy: RelaunchPolicy, now: Now, config: str = "") -> list[Action]:
    """Once every node confirmed the failed generation gone: the next generation (after the backoff of a crash
    loop), from ``config`` (the cohort's configuration in this node's unit files: every node must start its rank
    from the same, node_duties.start_refusal), or the slot dead when the crash loop goes on past max attempts."""
    gone = view.gone_hosts(slot.cohort, slot.generation)
    if not set(hosts) <= set(gone):
        return []
    detected = node.detected_at.get((slot.cohort, slot.generation), slot.since)
    teardown_s = max(gone.values()) - detected
    actions: list[Action] = [
        ObserveTeardown(teardown_s),
        Record("generation-gone", slot.cohort, slot.generation,
               {"teardown_s": round(teardown_s, 4), "per_node": {h: round(t - detected, 4) for h, t in gone.items()}})]
    if view.fenced:  # a GPU out of service: no cohort can run; held until an operator unfences the node
        held = Slot(cohort=slot.cohort, generation=slot.generation, state=DEAD, reason=NODE_FENCED,
                    attempts=slot.attempts, since=now.wall)
        return actions + [SwapSlot(held, revision, "dead", then=(
            Record("slot-held", slot.cohort, slot.generation, {"fenced": sorted(view.fenced), "detail": (
                "relaunch held while a node is fenced; it resumes by itself once the node is unfenced")}),))]
    decision = policy.after_death(slot.attempts, ran_for(slot, driver))
    attempts = decision.attempts
    if decision.gives_up:
        dead = Slot(cohort=slot.cohort, generation=slot.generation, state=DEAD, reason="crash-loop",
                    attempts=attempts, since=now.wall)
        detail = "crash loop: relaunches stopped; fix the cause, then run playbooks/failover.yml"
        return actions + [SwapSlot(dead, revision, "dead", then=(
            Record("slot-dead", slot.cohort, slot.generation, {"attempts": attempts, "detail": detail}),))]
    delay = decision.delay_s
    launching = Slot(cohort=slot.cohort, generation=slot.generation + 1, state=LAUNCHING, since=now.wall,
                     reason=f"relaunch after {slot.reason}", attempts=attempts, not_before=now.wall + delay,
                     config=config)
    return actions + [SwapSlot(launching, revision, "relaunch", detected=detected, launch_at=now.wall + delay, then=(
        Record("relaunch-scheduled", slot.cohort, slot.generation + 1,
               {"delay_s": round(delay, 3), "attempts": attempts}),))]


def mixed_generations(view: DeploymentView, driver: DriverMemory) -> list[Action]:
    """A generation whose ranks run two configurations (their nodes' records, RankRecord: started from unit
    files of two configurations, e.g. one node's rank started before an upgrade's files reached it and another's
    after) is no engine group: its ranks disagree on their arguments (a hang in the first collective, or wrong
    results). Declared failed (mixed-configuration), once; the next generation starts from one configuration on
    every node (node_duties.start_refusal). Only a record of the node's present agent counts: one an agent
    before it wrote says what ran when that agent stopped (an upgrade restarts ranks while the agents are
    stopped), and the present agent writes its own as soon as it has adopted the rank."""
    actions: list[Action] = []
    for cohort, entry in sorted(view.slots.items()):
        slot = entry.slot
        if slot.state not in (RUNNING, LAUNCHING) or (cohort, slot.generation) in driver.mixed:
            continue
        configs = {host: record.config for host, record in sorted(view.ranks.get(cohort, {}).items())
                   if record.generation == slot.generation and record.config
                   and record.agent and view.agent_instances.get(host) == record.agent}
        if len(set(configs.values())) < 2:
            continue
        detail = "the generation's ranks run " + ", ".join(f"{c} on {h}" for h, c in configs.items())
        actions += [NoteMixed(cohort, slot.generation),
                    Record(MIXED_CONFIGURATION, cohort, slot.generation, {"configs": configs, "detail": detail}),
                    Declare(cohort, slot.generation, MIXED_CONFIGURATION,
                            {"signal": "configuration", "evidence": detail, "configs": configs})]
    return actions


def unfenced_due(slot: Slot, revision: int, view: DeploymentView, now: Now, config: str = "") -> list[Action]:
    """A slot held while a node was fenced, once no node is: relaunched (a new generation, no crash-loop count)."""
    if slot.state != DEAD or slot.reason != NODE_FENCED or view.fenced:
        return []
    launching = Slot(cohort=slot.cohort, generation=slot.generation + 1, state=LAUNCHING, since=now.wall,
                     reason="relaunch after unfence", attempts=0, not_before=now.wall, config=config)
    return [SwapSlot(launching, revision, "relaunch", launch_at=now.wall, then=(
        Record("relaunch-scheduled", slot.cohort, slot.generation + 1, {"delay_s": 0.0, "after": "unfence"}),))]


def fences_reported(view: DeploymentView, driver: DriverMemory) -> list[Action]:
    """Say once, loudly, what a fenced node means for serving (and when it was unfenced)."""
    if set(view.fenced) == driver.fences_reported:
        return []
    actions: list[Action] = []
    for host in sorted(set(view.fenced) - driver.fences_reported):
        record = view.fenced[host]
        actions.append(Record("serving-needs-hardware", fields={
            "node": host, "gpu": record.get("gpu"), "xid": record.get("xid"), "action": record.get("action"),
            "detail": (f"{host} is fenced ({record.get('detail', 'a GPU out of service')}): every cohort has a rank "
                       f"on it, so nothing serves until the GPU is reset or the node replaced. Then: "
                       f"ansible-playbook playbooks/failover.yml -e unfence={host}")}))
    actions += [Record("unfenced", fields={"node": host}) for host in sorted(driver.fences_reported - set(view.fenced))]
    return actions + [NoteFences(frozenset(view.fenced))]


def running_due(slot: Slot, revision: int, driver: DriverMemory, node: NodeMemory, now: Now) -> list[Action]:
    """A launching generation whose leader answered /health with a 200 (parked, or serving) since this node tracks
    it (the node's own leader probes, in threads: node_duties.judge_rank): running. Never healthy within
    LAUNCH_TIMEOUT_S: failed."""
    actions: list[Action] = []
    launched = driver.launched_at.get((slot.cohort, slot.generation))
    if launched is None:
        launched = now.wall
        actions.append(NoteLaunched(slot.cohort, slot.generation, now.wall))
    rank = node.ranks.get(slot.cohort)
    if rank is None or rank.generation != slot.generation:
        return actions
    if rank.healthy_at is not None:
        running = Slot(cohort=slot.cohort, generation=slot.generation, state=RUNNING, reason="parked",
                       attempts=slot.attempts, since=now.wall, not_before=slot.not_before)
        detected = node.detected_at.get((slot.cohort, slot.generation - 1))
        return actions + [SwapSlot(running, revision, "running", then=(
            Record("relaunch-complete", slot.cohort, slot.generation,
                   {"relaunch_s": rounded(now.wall - detected) if detected else None}),))]
    if now.wall - launched > LAUNCH_TIMEOUT_S:
        actions.append(Declare(slot.cohort, slot.generation, "launch-timeout"))
    return actions


def stable_due(slot: Slot, revision: int, failover: Failover, now: Now) -> list[Action]:
    """A generation that ran stable_after_s since a relaunch: its slot's crash-loop count starts again."""
    if slot.state != RUNNING or not slot.attempts or now.wall - slot.since <= failover.stable_after_s:
        return []
    return [SwapSlot(replace(slot, attempts=0), revision, "stable")]


# --- slot records: the first ones, broken ones -------------------------------------------------------------------
def first_view(view: DeploymentView, cohorts: list[int], driver: DriverMemory, node: NodeMemory,
               configs: dict[int, str] | None = None) -> list[Action]:
    """What the driver takes from etcd when it starts: the serving cohort, and a slot for each cohort that has
    none yet (running when its rank runs here, else launching)."""
    if driver.adopted:
        return []
    actions: list[Action] = [SetServing(view.active.cohort if view.active else None)]
    for cohort in cohorts:
        if view.slot(cohort) is not None or any(k.endswith(f"/slots/{cohort}") for k in view.invalid):
            continue
        rank = node.ranks.get(cohort)
        if rank is not None:
            actions.append(CreateSlot(Slot(cohort=cohort, generation=rank.generation or 1, state=RUNNING)))
        else:
            actions.append(CreateSlot(Slot(cohort=cohort, generation=1, state=LAUNCHING, reason="not running",
                                           config=(configs or {}).get(cohort, ""))))
    return actions


def repair_invalid(view: DeploymentView, cohorts: list[int], node: NodeMemory, now: Now,
                   configs: dict[int, str] | None = None) -> list[Action]:
    """A slot record of a planned cohort that does not parse (and was not written by a newer shadowline): write a
    good one in its place, compare-and-swapped on its revision. The driver's rank of the cohort runs: that
    generation is running. Else a new generation launches on every node (older ranks are retired)."""
    actions: list[Action] = []
    for key, bad in sorted(view.invalid.items()):
        cohort_text = key.rsplit("/", 1)[-1]
        if bad.newer or "/slots/" not in key or not cohort_text.isdigit() or int(cohort_text) not in cohorts:
            continue
        cohort = int(cohort_text)
        rank = node.ranks.get(cohort)
        if rank is not None and rank.generation:
            slot = Slot(cohort=cohort, generation=rank.generation, state=RUNNING, reason="repaired", since=now.wall)
        else:
            known = [g for (c, g) in view.gone if c == cohort] + [g for (c, g) in node.detected_at if c == cohort]
            slot = Slot(cohort=cohort, generation=max(known, default=0) + 1, state=LAUNCHING, since=now.wall,
                        reason="repaired", not_before=now.wall, config=(configs or {}).get(cohort, ""))
        actions.append(SwapSlot(slot, bad.revision, "repair", then=(
            Record("record-repaired", cohort, slot.generation, {"key": key, "why": bad.why, "state": slot.state}),)))
    return actions


# --- other agents, the GMS servers -----------------------------------------------------------------------------
def watch_agents(view: DeploymentView, host: str, driver: DriverMemory, failover: Failover, now: Now) -> list[Action]:
    """A node whose agent's lease expired: nobody watches its ranks. Its loss alone fails no cohort (the ranks
    may be fine, and every cohort has a rank on every node); a node that is really gone shows in its peers'
    collectives and the leader's health. What neither may show (vLLM's /health can stay 200 after a worker rank
    died) is caught here: while any agent is lost, the driver sends a completion through the frontend every
    SERVING_PROBE_S, and declares the serving generation failed (node-lost) when none has succeeded for
    health_timeout_s plus the request timeout."""
    live = view.agents
    actions: list[Action] = [AgentsSeen(live)] if not live <= driver.agents_seen else []
    lost = dict(driver.agents_lost)
    ok_at = driver.serving_ok_at
    for name in sorted((driver.agents_seen | live) - {host}):
        if name in live and name in lost:
            actions += [AgentBack(name), Record("agent-back", fields={"node": name,
                                                                      "lost_s": round(now.mono - lost.pop(name), 3)})]
        elif name not in live and name not in lost:
            lost[name] = ok_at = now.mono
            actions += [AgentLost(name, now.mono), Record("agent-lost", fields={
                "node": name, "detail": "its ranks are unsupervised; serving is probed through the frontend"})]
    if not lost or driver.serving is None or driver.promotion is not None:
        return actions
    if now.mono >= driver.next_serving_probe:
        actions.append(ProbeServing(now.mono + SERVING_PROBE_S))
    slot = view.slot(driver.serving)
    silent = now.mono - ok_at
    if slot is not None and slot.state == RUNNING and silent > failover.health_timeout_s + SERVING_SILENT_EXTRA_S:
        actions += [Record("serving-silent", driver.serving, slot.generation,
                           {"silent_s": round(silent, 3), "lost": sorted(lost)}),
                    Declare(driver.serving, slot.generation, "node-lost")]
    return actions


def watch_idle_serving(view: DeploymentView, driver: DriverMemory, node: NodeMemory, hang: HangPolicy,
                       failover: Failover, now: Now) -> list[Action]:
    """An idle serving cohort shows nothing in its metrics (vLLM's running gauge stays 0 and its token counter
    still when an idle engine hangs): only a request finds an idle hang before a user does. While the serving
    leader's metrics say nothing is running, a one-token canary goes through the frontend every
    canary_interval_s (canary_due), and the one in flight is judged (judge_canary)."""
    if driver.canary is not None:
        return judge_canary(driver.canary, view, driver, node, hang, now)
    return canary_due(view, driver, node, failover, now)


def judge_canary(canary: Canary, view: DeploymentView, driver: DriverMemory, node: NodeMemory, hang: HangPolicy,
                 now: Now) -> list[Action]:
    """A canary with no answer when HangPolicy says it waited too long (progress_stall_s), the leader's token
    counter not moved since and the leader still answering its /health, declares the serving generation failed
    (canary-unanswered); a leader silent on /health too is left to its health verdict (leader-hung, the more
    exact name: HangPolicy.health_verdict_pending). An answer that is an error (no worker registered, a routing
    failure, the frontend itself silent: executor.probe asks its /live first) is recorded, never declared: it
    says nothing of the engine."""
    slot = view.slot(canary.cohort)
    if (driver.serving != canary.cohort or driver.promotion is not None or slot is None
            or slot.generation != canary.generation or slot.state != RUNNING):
        return [EndCanary()]
    if canary.answer is not None:
        if canary.answer.ok:
            return [EndCanary()]
        return [EndCanary(), Record("canary-failed", canary.cohort, canary.generation,
                                    {"status": canary.answer.status, "error": canary.answer.error})]
    waited = now.mono - canary.sent_at
    if not hang.canary_unanswered(waited):
        return []
    rank = node.ranks.get(canary.cohort)
    tokens = rank.progress.tokens if rank is not None and rank.progress is not None else None
    if tokens is not None and canary.tokens is not None and tokens > canary.tokens:
        return [EndCanary()]  # the engine generates: a slow answer, not a hang
    if rank is not None and rank.leader and hang.health_verdict_pending(silence(rank.healthy_at, 0.0, now.mono)):
        return []  # the leader itself gives no 200 from /health: judge_rank names it (leader-hung) at its deadline
    detail = (f"a one-token canary completion to the idle serving cohort had no answer for {waited:.1f} s "
              f"(progress_stall_s {hang.progress_stall_s:g}), the token counter still")
    evidence = rank.culprit("canary", detail) if rank is not None else {"signal": "canary", "evidence": detail}
    return [EndCanary(), Declare(canary.cohort, canary.generation, CANARY_UNANSWERED, evidence)]


def canary_due(view: DeploymentView, driver: DriverMemory, node: NodeMemory, failover: Failover,
               now: Now) -> list[Action]:
    """A canary to the serving cohort when it is due and its leader (on this node) shows nothing running."""
    if driver.serving is None or driver.promotion is not None or now.mono < driver.next_canary:
        return []
    slot = view.slot(driver.serving)
    rank = node.ranks.get(driver.serving)
    if slot is None or slot.state != RUNNING or rank is None or rank.generation != slot.generation:
        return []
    if rank.progress is not None and rank.progress.running:
        return []  # requests run: the token counter judges (node_duties.judge_rank)
    tokens = rank.progress.tokens if rank.progress is not None else None
    return [SendCanary(driver.serving, slot.generation, now.mono, tokens, now.mono + failover.canary_interval_s)]


def republish_weights(view: DeploymentView, driver: DriverMemory) -> list[Action]:
    """After a GMS server died, relaunch the writer cohort (ENGINE_ID=0 loads from disk and publishes) so the
    weights are resident again for future shadows. If cohort 0 is serving, a parked shadow takes over first
    (one planned failover); with no parked shadow, serving is left alone and the gap is reported."""
    if not view.gms_lost:
        return []
    hosts = sorted(view.gms_lost)
    zero = view.slot(0)
    serving = parse_holder(driver.holder or "")
    parked = [c for c, e in view.slots.items() if c != 0 and e.slot.state == RUNNING and c != serving]
    choice = republish_choice(zero is not None and zero.state == RUNNING, serving == 0, bool(parked))
    actions: list[Action]
    if zero is None or choice == REPUBLISH_UNDER_WAY:
        actions = [Record("gms-republish", 0, None, {"nodes": hosts, "detail": "the writer is relaunching already"})]
    elif choice == REPUBLISH:
        actions = [Record("gms-republish", 0, zero.generation, {"nodes": hosts, "serving": serving}),
                   Declare(0, zero.generation, "gms-republish")]
    else:
        actions = [Record("gms-degraded", 0, zero.generation, {
            "nodes": hosts, "detail": "no parked shadow can take over while the writer republishes; serving "
                                      "continues, but a failover now would find no resident weights"})]
    return actions + [ClearGmsLost(tuple(view.gms_lost[h] for h in hosts))]


# --- the duties, in the order a tick needs them -------------------------------------------------------------------
class DriverDuties:
    def __init__(self, plan: Plan, host: str, node: NodeMemory, memory: DriverMemory,
                 execute: Callable[[list[Action]], None]) -> None:
        self.plan = plan
        self.host = host
        self.node = node
        self.memory = memory
        self.policy = RelaunchPolicy.of(plan.failover)
        self.hang = HangPolicy.of(plan.failover)
        self.execute = execute

    def holder(self) -> str | None:
        return lock_holder(self.plan.lock_path)

    def watch_lock(self, holder: str | None, view: DeploymentView | None, now: Now) -> None:
        self.execute(lock_changed(holder, self.plan, view, self.memory, self.node, now))

    def etcd_back(self, outage_s: float) -> None:
        """etcd answers again after ``outage_s``: a promotion's deadlines do not count the outage (a waking shadow
        registers in discovery, which is etcd), and a canary sent before or during it is no verdict (the frontend
        and the engine wait on etcd too); the engines' discovery leases are renewed once (RefreshLeases)."""
        self.execute(([ExtendPromotion(outage_s)] if self.memory.promotion is not None else [])
                     + ([EndCanary()] if self.memory.canary is not None else []) + [RefreshLeases(outage_s)])

    def drive(self, view: DeploymentView, now: Now) -> None:
        configs = observe.installed_configs(self.plan)  # a file read per cohort
        self.execute(first_view(view, self.plan.cohort_ids, self.memory, self.node, configs))
        self.execute(repair_invalid(view, self.plan.cohort_ids, self.node, now, configs))
        self.execute(mixed_generations(view, self.memory))
        self.execute(republish_weights(view, self.memory))
        engines = {c: cgroup_pids(r.cgroup) for c, r in self.node.ranks.items() if r.cgroup}
        self.execute(lock_identity(lock_seen(self.plan.lock_path, engines), view, self.memory,
                                   {c: self.plan.cohort(c).engine_id for c in self.plan.cohort_ids}, now))
        promotion = self.memory.promotion
        seen = promotion.seen if promotion is not None and promotion.seen is not None else PromotionSeen()
        self.execute(verify_promotion(view, self.memory, self.node, seen, now))
        self.execute(promotion_look_due(self.memory, now))
        self.execute(watch_agents(view, self.host, self.memory, self.plan.failover, now))
        self.execute(watch_idle_serving(view, self.memory, self.node, self.hang, self.plan.failover, now))
        self.execute(fences_reported(view, self.memory))
        self.execute(revoke_due(view, self.memory, self.node, now))
        for entry in view.slots.values():
            slot, revision = entry.slot, entry.revision
            if slot.state == FAILED:
                self.execute(relaunch_due(slot, revision, view, self.plan.hosts, self.memory, self.node,
                                          self.policy, now, configs.get(slot.cohort, "")))
            elif slot.state == LAUNCHING and now.wall >= slot.not_before:
                self.execute(running_due(slot, revision, self.memory, self.node, now))
            elif slot.state == RUNNING:
                self.execute(stable_due(slot, revision, self.plan.failover, now))
            elif slot.state == DEAD:
                self.execute(unfenced_due(slot, revision, view, now, configs.get(slot.cohort, "")))
