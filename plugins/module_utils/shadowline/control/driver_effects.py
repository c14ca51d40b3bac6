"""What the executor does for the driver only (control/executor.py's DRIVER_ACTIONS), on the leader node: the
slots' compare-and-swaps and creations, the discovery registrations revoked and leases renewed (what the
frontend routes to), the failover lock's bridge, the promotion's looks and completions, the serving cohort's
probes and canaries, and the driver's memory (DriverMemory, given with each action)."""

from __future__ import annotations

import os
import time

from ..cluster.discovery import registrations, revoke_leases, worker_registrations
from ..common.coordination import Coordination
from ..common.etcd_client import Etcd, EtcdError
from ..common.events import EventLog
from ..common.lock import try_acquire
from ..deployment.plan import Plan
from . import observe
from .actions import (
    Action,
    AgentLost,
    AgentsSeen,
    BeginPromotion,
    ClearGmsLost,
    CreateSlot,
    DeferRevocation,
    EndPromotion,
    ExtendPromotion,
    NoteFences,
    NoteLockReplaced,
    ProbeServing,
    PromotionActive,
    PromotionRegistered,
    RecordActive,
    RevokeRegistration,
    SendCanary,
    SetHolder,
    SetServing,
    SwapSlot,
    TakeBridge,
)
from .agent_metrics import AgentMetrics
from .memory import Canary, DriverMemory, NodeMemory
from .probes import Probes


class DriverEffects:
    def __init__(self, plan: Plan, host: str, etcd: Etcd, events: EventLog, metrics: AgentMetrics,  # noqa: PLR0913 (the driver's node, its store and what it reports to)
                 node: NodeMemory, probes: Probes) -> None:
        self.plan = plan
        self.etcd = etcd
        self.coord = Coordination(etcd, plan.deployment, plan.replica_of(host).id)
        self.events = events
        self.metrics = metrics
        self.node = node  # the driver node's own memory: a relaunch's detection time, the promoted rank's cgroup
        self.probes = probes  # the threads of the frontend's completions and the looks at the promotion

    def defer_revocation(self, action: DeferRevocation, driver: DriverMemory) -> None:
        driver.unrevoked[(action.cohort, action.generation)] = action.since

    def set_serving(self, action: SetServing, driver: DriverMemory) -> None:
        driver.adopted = True
        if driver.serving is None:
            driver.serving = action.cohort

    def create_slot(self, action: CreateSlot, driver: DriverMemory) -> None:
        try:
            if self.coord.create_slot(action.slot):
                self.events.write("slot-created", action.slot.cohort, action.slot.generation,
                                  state=action.slot.state)
        except EtcdError:
            driver.adopted = False  # the next view tries again

    def set_holder(self, action: SetHolder, driver: DriverMemory) -> None:
        if driver.holder is not None:
            driver.last_holder = driver.holder
        driver.holder = action.holder

    def begin_promotion(self, action: BeginPromotion, driver: DriverMemory) -> None:
        driver.promotion = action.promotion

    def take_bridge(self, action: TakeBridge, driver: DriverMemory) -> None:
        driver.bridge = try_acquire(self.plan.lock_path, action.engine_id)
        if driver.bridge is not None:  # the engines' user must open it, as the file it replaces
            directory = os.stat(os.path.dirname(self.plan.lock_path))
            os.fchown(driver.bridge.fd, directory.st_uid, directory.st_gid)
            self.events.write("lock-bridged", detail=f"the driver holds {self.plan.lock_path} for engine-"
                                                     f"{action.engine_id} until that engine lets its lock go")

    def release_bridge(self, driver: DriverMemory) -> None:
        if driver.bridge is not None:
            driver.bridge.release()
        driver.bridge = None
        driver.lock_replaced_at = None

    def note_lock_replaced(self, action: NoteLockReplaced, driver: DriverMemory) -> None:
        driver.lock_replaced_at = action.when

    def extend_promotion(self, action: ExtendPromotion, driver: DriverMemory) -> None:
        if driver.promotion is not None:
            driver.promotion.wake_deadline += action.seconds
            driver.promotion.deadline += action.seconds

    def promotion_active(self, action: PromotionActive, driver: DriverMemory) -> None:
        if driver.promotion is not None:
            driver.promotion.active_at = action.at

    def promotion_registered(self, action: PromotionRegistered, driver: DriverMemory) -> None:
        p = driver.promotion
        if p is not None:
            p.leases, p.registered_at = list(action.leases), action.at
            driver.registered[(p.cohort, p.generation)] = list(action.leases)

    def probe_promotion(self, driver: DriverMemory) -> None:
        p = driver.promotion
        if p is not None:
            p.probing = True
            self.probes.probe("promotion", p.cohort, p.generation)

    def end_promotion(self, action: EndPromotion, driver: DriverMemory) -> None:
        if action.promoted and driver.promotion is not None:
            driver.serving = driver.promotion.cohort
        driver.promotion = None
        if action.count:
            self.metrics.count(action.count)

    def record_active(self, action: RecordActive) -> None:
        try:
            self.coord.record_active(action.cohort, action.generation)
        except EtcdError as err:
            self.events.write("record-active-error", action.cohort, action.generation, error=str(err))
        if action.promote_s is not None:
            self.metrics.observe("promotion_seconds", action.promote_s)

    def note_agents_seen(self, action: AgentsSeen, driver: DriverMemory) -> None:
        driver.agents_seen |= action.nodes

    def agent_lost(self, action: AgentLost, driver: DriverMemory) -> None:
        driver.agents_lost[action.node] = action.at
        driver.serving_ok_at = action.at
        self.metrics.count("agents_lost_total")

    def probe_serving(self, action: ProbeServing, driver: DriverMemory) -> None:
        driver.next_serving_probe = action.next_at
        self.probes.probe("serving")

    def end_canary(self, driver: DriverMemory) -> None:
        driver.canary = None

    def note_fences(self, action: NoteFences, driver: DriverMemory) -> None:
        driver.fences_reported = set(action.nodes)

    def clear_gms_lost(self, action: ClearGmsLost) -> None:
        for key in action.keys:
            try:
                self.etcd.delete(key)
            except EtcdError:
                pass  # seen again next pass: the republish decision is idempotent

    def refresh_leases(self, outage_s: float) -> None:
        """Renew every discovery lease once; a lease that is gone, or etcd away again, is left to its owner."""
        renewed = []
        try:
            for registration in registrations(self.etcd):
                if self.etcd.lease_keepalive(registration.lease) > 0:
                    renewed.append(f"{registration.lease:x}")
        except EtcdError as err:
            self.events.write("leases-refresh-error", error=str(err))
        self.events.write("leases-refreshed", outage_s=round(outage_s, 3), leases=renewed)

    def send_canary(self, action: SendCanary, driver: DriverMemory) -> None:
        driver.next_canary = action.next_at
        driver.canary = Canary(action.cohort, action.generation, action.sent_at, action.tokens)
        # the request may take longer than the canary's judgement: the driver decides at progress_stall_s
        self.probes.probe("canary", action.cohort, action.generation,
                          timeout=2 * self.plan.failover.progress_stall_s + 1)

    def swap(self, action: SwapSlot, driver: DriverMemory) -> list[Action]:
        """One compare-and-swap of a slot; what the swap then asks for (action.then) if it was made, for the
        executor to perform."""
        try:
            swapped = self.coord.swap(action.slot, action.revision)
        except EtcdError:
            return []
        if not swapped:
            return []
        slot = action.slot
        if action.kind == "dead":
            self.metrics.count("slots_dead_total")
        elif action.kind == "relaunch":
            if action.detected is not None:
                self.node.detected_at[(slot.cohort, slot.generation - 1)] = action.detected
            if action.launch_at is not None:  # a launch can fail before the next pass
                driver.launched_at[(slot.cohort, slot.generation)] = action.launch_at
        return list(action.then)

    def revoke(self, action: RevokeRegistration, driver: DriverMemory) -> None:
        failed = (action.cohort, action.generation)
        recorded = driver.registered.get(failed, [])
        others = {lease for key, held in driver.registered.items() if key != failed and key[0] == action.cohort
                  for lease in held}
        try:  # a later generation of the cohort may be registered by now: its leases are not the failed one's
            found = [lease for lease in self.registrations(action.cohort) if lease not in others]
            leases = list(dict.fromkeys([*recorded, *found]))
            revoked = revoke_leases(self.etcd, leases) if leases else []
        except EtcdError as err:
            # tried again (revoke_due, at most every REVOKE_RETRY_S while etcd answers): a dead registration
            # left would keep the frontend routing requests to it for its lease's 30 s
            driver.unrevoked.setdefault(failed, time.time())
            driver.revoke_failed_at[failed] = time.time()
            self.events.write("revoke-error", action.cohort, action.generation, error=str(err))
            return
        driver.revoked.add(failed)
        driver.unrevoked.pop(failed, None)
        driver.revoke_failed_at.pop(failed, None)
        driver.registered.pop(failed, None)
        if revoked:
            self.events.write("registration-revoked", action.cohort, action.generation,
                              leases=[f"{lease:x}" for lease in revoked])

    def registrations(self, cohort: int, ports: set[int] | None = None) -> list[int]:
        """The discovery leases of ``cohort``'s leader (see discovery.cohort_registrations)."""
        c = self.plan.cohort(cohort)
        return [r.lease for r in worker_registrations(self.etcd, c.leader.address, c.ports.system, ports or (),
                                                      self.plan.model_id)]

    def look_at_promotion(self, driver: DriverMemory) -> None:
        """The promoted cohort looked at in a thread of its own (an HTTP read of its leader's metrics, then an etcd
        read of discovery, every 50 ms while it is verified: in the loop they held up the driver node's own
        teardown of the failed cohort); the answer wakes the loop."""
        p = driver.promotion
        if p is None:
            return
        p.looking, p.look_sent = True, time.monotonic()
        rank = self.node.ranks.get(p.cohort)
        cohort, generation, want_state = p.cohort, p.generation, p.active_at is None
        cgroup = rank.cgroup if rank is not None else None
        self.probes.answer_in_thread(f"promotion-look-{cohort}", self.probes.promotion_looks, lambda: (
            cohort, generation, observe.look_at_promotion(self.plan, cohort, want_state, cgroup, self.registrations)),
            b"v")
