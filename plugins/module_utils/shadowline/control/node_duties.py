"""What every node's agent decides about its own ranks, as pure functions of (the deployment view, the node's
observations, the agent's memory, the clock) returning actions (actions.py); and NodeDuties, which observes,
calls them and hands their actions to the executor, in the order a tick needs them.

Duties: a rank that exits (pidfd) is torn down on this node at once (local first: before etcd hears of it) and
its generation declared failed; a slot declared failed tears this node's rank down (at once, from the watch event:
the hot path); a hung leader (/health) or a stalled generation (vLLM's progress metrics on the leader) fails its
generation; the ranks follow the slot records (launch a new
generation, retire a leftover, abandon a start that was superseded, confirm a teardown only once the rank's
cgroup is empty). Generations are fencing tokens: a rank is only started into a generation whose slot is
launching; a running generation with this node's rank missing is declared failed, never completed by starting the
one rank alone: with the failure this node knows was its cause (declared here, or told by another node's notice),
else as rank-missing (it died while nobody watched).
"""

from __future__ import annotations

from collections.abc import Callable

from ..common import progress
from ..common.coordination import DEAD, FAILED, LAUNCHING, RUNNING, Slot
from ..common.gpu_health import GpuFault
from ..common.policy import CONFIG_MISMATCH, GENERATION_STALLED, GPU_FAULT, GPU_XID, HangPolicy, silence
from ..common.progress import ProgressSample
from ..common.settings import Failover
from ..common.xid_table import NONE
from ..deployment.plan import Plan
from . import observe
from .actions import (
    AbandonStart,
    Action,
    CheckStart,
    ClearFence,
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
    NoteFailure,
    NoteProgress,
    ProbeLeader,
    PublishRank,
    Record,
    ReportFault,
    ReportGmsLost,
    ReportInvalid,
    SetGeneration,
    TearDown,
    Untrack,
    WakeAt,
)
from .failure_notices import FailureNotice
from .memory import KnownFailure, LocalRank, NodeMemory, Start
from .observe import HealthAnswer, UnitState
from .view import Active, DeploymentView, Now

START_JOB_S = 30.0  # a unit start job that has not made the unit active by then has failed
INACTIVE_AFTER_START_S = 2.0  # a unit still inactive this long after `systemctl start`: its job did not run
START_LOOK_S = 0.05  # a start's unit looked at this often (the pace of the loop's tick when it ran in it)
CLOCK_SKEW_S = 1.0  # between nodes' clocks: an adopted rank started this much before its generation's launch is
# still counted as of that generation (NTP keeps cluster clocks far closer); earlier, it is a leftover
NOT_GONE_REPORT_S = 1.0  # a killed rank's cgroup still not empty after this long: say so (once)
PROGRESS_TIMEOUT_S = 0.5  # how long a /metrics read may take
RELAY_AFTER_S = 1.0  # a failure another node's agent told this one of, still not in etcd this long after: written
# here (node_duties.declare_missing); the declaring agent's own write normally lands within milliseconds


# --- decisions ----------------------------------------------------------------------------------------------------
def teardown_grace(slot: Slot, failover: Failover) -> float:
    """A planned failover lets the engines drain (SIGTERM, planned_grace_s); a failure kills at once."""
    return float(failover.planned_grace_s if slot.reason == "planned-failover" else failover.term_grace_s)


def rank_exited(rank: LocalRank, now: Now, failover: Failover) -> list[Action]:
    """The rank's main process exited: kill the rest of it here at once, then declare its generation failed."""
    return [Record("rank-exited", rank.cohort, rank.generation, {"pid": rank.pid}),
            TearDown(rank, now.wall, float(failover.term_grace_s)),
            Declare(rank.cohort, rank.generation, "rank-exited",
                    rank.culprit("process-exit", f"main process {rank.pid} of {rank.unit} exited"))]


def slot_failed(slot: Slot, memory: NodeMemory, failover: Failover, via: str = "etcd") -> list[Action]:
    """A generation declared failed (or dead): tear this node's rank of it down. [] when there is none. ``via``:
    how the agent heard of it (the slot record's watch event, or another agent's notice)."""
    rank = memory.ranks.get(slot.cohort)
    if slot.state not in (FAILED, DEAD) or rank is None or rank.generation > slot.generation:
        return []
    return [Record("teardown-requested", slot.cohort, slot.generation,
                   {"reason": slot.reason, "by": slot.detected_by, "via": via}),
            NoteDetected(slot.cohort, slot.generation, slot.since),
            TearDown(rank, slot.since, teardown_grace(slot, failover))]


def notice_failed(notice: FailureNotice, memory: NodeMemory, failover: Failover, now: Now) -> list[Action]:
    """Another node's agent declared a generation failed and told this one directly (failure_notices.py): tear
    this node's rank down at once if it runs exactly that generation (else the notice is not about it: a newer
    generation runs here, or none), and remember the failure (declare_missing). The declaration in etcd follows
    and finds the rank gone."""
    rank = memory.ranks.get(notice.cohort)
    if rank is None or rank.generation != notice.generation:
        return []
    known = KnownFailure(notice.generation, notice.reason, notice.evidence, notice.host, now.mono)
    return [NoteFailure(notice.cohort, known), *slot_failed(notice.slot(), memory, failover, via="notice")]


def settle_failed(slot: Slot, memory: NodeMemory, failover: Failover, now: Now,
                  leftover: LocalRank | None = None) -> list[Action]:
    """Reconcile a failed or dead slot: tear the rank down, or confirm there is nothing (any more) of it here.
    ``leftover``: processes in the cohort's unit that the agent does not track (it restarted meanwhile)."""
    actions = slot_failed(slot, memory, failover)
    if actions or slot.cohort in memory.terminating:
        return actions
    if leftover is not None:
        return [Record("leftover-found", slot.cohort, slot.generation, {"cgroup": leftover.cgroup}),
                TearDown(leftover, now.wall, 0.0)]
    return [Confirm(slot.cohort, slot.generation, now.wall)] if slot.state == FAILED else []


def teardowns_due(memory: NodeMemory, alive: dict[int, bool], now: Now) -> list[Action]:
    """Teardowns whose cgroups are empty: finish them (confirm). Those whose grace ended, or whose processes
    outlived SIGKILL: SIGKILL what is left, again (never confirmed gone while anything of it runs)."""
    actions: list[Action] = []
    for cohort, teardown in memory.terminating.items():
        if not alive.get(cohort, False):
            actions.append(FinishTeardown(cohort))
        elif now.mono >= teardown.kill_at:
            actions.append(KillRest(cohort))
    return actions


def abandon_stale_start(slot: Slot, memory: NodeMemory) -> list[Action]:
    """A start this agent began for a generation that failed or was superseded meanwhile: stop it, so that the
    slot's record and this node agree (and a newer generation is not held up by it)."""
    start = memory.starting.get(slot.cohort)
    if start is None:
        return []
    if start.generation >= slot.generation and not (slot.state in (FAILED, DEAD) and start.generation == slot.generation):
        return []
    return [AbandonStart(slot.cohort, start.generation, slot.generation, slot.state)]


def retire_leftover(slot: Slot, memory: NodeMemory, failover: Failover, now: Now) -> list[Action]:
    """A rank of an older generation than the slot's (launching or running): tear it down."""
    rank = memory.ranks.get(slot.cohort)
    if slot.state not in (LAUNCHING, RUNNING) or rank is None or rank.generation >= slot.generation:
        return []
    return [TearDown(rank, now.wall, float(failover.term_grace_s))]


def launch_due(slot: Slot, memory: NodeMemory, now: Now) -> list[Action]:
    """No rank of the slot here. Launching: start it once its not_before has come, else wake then. Running: this
    node's rank of the running generation is missing (torn down by a failure etcd does not show yet, or it died
    while the agent was down or etcd was away): the generation has failed (declare_missing); starting the one
    rank alone would make a mixed generation."""
    cohort = slot.cohort
    if slot.state not in (LAUNCHING, RUNNING) or cohort in memory.ranks:
        return []
    if cohort in memory.starting or cohort in memory.terminating:
        return []
    if slot.state == RUNNING:
        return declare_missing(slot, memory.known_failures.get(cohort), now)
    if now.wall >= slot.not_before:
        return [NoteDetected(cohort, slot.generation - 1, slot.since), Launch(cohort, slot.generation, slot.config)]
    return [WakeAt(now.mono + slot.not_before - now.wall, full=True)]


def declare_missing(slot: Slot, known: KnownFailure | None, now: Now) -> list[Action]:
    """This node's rank of the running generation is missing. A failure of that generation this node knows of is
    its cause, declared with its own reason and evidence: at once when it was declared here (that write did not
    land: etcd was away); RELAY_AFTER_S after another node's agent told this one it declared it (its own write
    comes first, in milliseconds; a node whose teardown from the notice ended first must not write a
    rank-missing of its own before it). Else the rank died while nobody watched: rank-missing."""
    if known is None or known.generation != slot.generation:
        return [Record("rank-missing", slot.cohort, slot.generation,
                       {"detail": "this node's rank of the running generation is not running"}),
                Declare(slot.cohort, slot.generation, "rank-missing")]
    if known.told_by is None:
        return [Declare(slot.cohort, slot.generation, known.reason, known.evidence)]
    relay_at = known.at + RELAY_AFTER_S
    if now.mono < relay_at:
        return [WakeAt(relay_at, full=True)]
    detail = (f"{known.told_by} declared it failed and told this node, but etcd still shows it running "
              f"{now.mono - known.at:.1f} s later")
    return [Record("declaration-relayed", slot.cohort, slot.generation,
                   {"reason": known.reason, "by": known.told_by, "detail": detail}),
            Declare(slot.cohort, slot.generation, known.reason, {**known.evidence, "declared_by": known.told_by})]


def adopted_generation(rank: LocalRank, slot: Slot | None) -> int:
    """The generation of a rank found running when the agent started: the slot's, unless the rank started well
    before that generation was launched (then it is a leftover of an older one, torn down by retire_leftover)."""
    if slot is None:
        return 1
    if rank.started < slot.not_before - CLOCK_SKEW_S:
        return slot.generation - 1
    return slot.generation


def settle_adopted(view: DeploymentView, memory: NodeMemory, now: Now) -> list[Action]:
    """Give each adopted rank its generation, from the first view of the slots."""
    actions: list[Action] = []
    for cohort, rank in memory.ranks.items():
        if rank.generation:
            continue
        slot = view.slot(cohort)
        actions.append(SetGeneration(cohort, adopted_generation(rank, slot)))
        if slot is not None and slot.state == RUNNING:  # it was healthy before this agent started
            actions.append(MarkHealthy(cohort, now.mono))
    return actions


def report_invalid(view: DeploymentView, memory: NodeMemory) -> list[Action]:
    """Records of the view the agent ignores: reported once per revision."""
    return [ReportInvalid(key, bad.revision, bad.why, bad.newer) for key, bad in sorted(view.invalid.items())
            if (key, bad.revision) not in memory.reported_invalid]


def start_refusal(expected: str, installed: str) -> str:
    """Why this node must not start its rank of a generation launched with configuration ``expected`` (the
    slot's), from the configuration its unit files hold (observe.installed_config_of); "" when it may. Ranks of
    one generation started from files of two configurations (an upgrade's files installed on one node and not
    yet on another) would make a mixed cohort: refused, the generation is declared failed (config-mismatch) and
    the driver launches the next one from the files it then finds. A slot without a configuration (written by an
    older agent) takes whatever the unit has."""
    if not expected or installed == expected:
        return ""
    return (f"the unit holds configuration {installed or '(none)'}, the generation was launched with "
            f"{expected}: its ranks would run two configurations")


def publish_due(view: DeploymentView, memory: NodeMemory, host: str) -> list[Action]:
    """This node's record of each rank it runs (generation, configuration, this agent), written where etcd lacks
    it or holds another (a new generation, an adopted rank, a record an agent before this one wrote); the driver
    compares them."""
    actions: list[Action] = []
    for cohort, rank in sorted(memory.ranks.items()):
        if not rank.generation:
            continue
        record = view.ranks.get(cohort, {}).get(host)
        wanted = (rank.generation, rank.config)
        held = None if record is None else (record.generation, record.config, record.agent)
        if memory.published.get(cohort) != wanted and held != (*wanted, memory.instance):
            actions.append(PublishRank(cohort, rank.generation, rank.config, rank.pid))
    return actions


def start_failure(unit: UnitState, since: float, now: Now) -> str | None:
    """Why a unit this agent started (at ``since``, monotonic) is not running, as soon as systemd says so; None
    while it starts."""
    if unit.active_state == "failed":
        return f"the unit failed ({unit.result})"
    if unit.active_state in ("inactive", "deactivating") and now.mono - since > INACTIVE_AFTER_START_S:
        return f"the unit is {unit.active_state}: its start job did not run or it exited at once"
    if now.mono - since > START_JOB_S:
        return f"the unit is still {unit.active_state}/{unit.sub_state} after {START_JOB_S:.0f} s"
    return None


def start_progress(cohort: int, start: Start, tracked: LocalRank | None, unit: UnitState | None,
                   now: Now) -> list[Action]:
    """A start in progress: the rank runs (track it), systemd says it failed (declare), or still starting."""
    if tracked is not None:
        return [Launched(tracked)]
    if start.refused:
        return [LaunchFailed(cohort, start.generation, start.refused),
                Declare(cohort, start.generation, CONFIG_MISMATCH, {"signal": "configuration", "evidence": start.refused})]
    failure = start_failure(unit or UnitState("unknown"), start.since, now)
    if failure is None:
        return []
    return [LaunchFailed(cohort, start.generation, failure), Declare(cohort, start.generation, "launch-failed")]


def starts_to_check(memory: NodeMemory, now: Now) -> list[Action]:
    """A look at each start systemd was asked for (until then its unit still shows the failed generation), with
    none out for that start already and none answered in the last START_LOOK_S: in a thread (CheckStart), judged
    when it answers (judge_start)."""
    return [CheckStart(cohort, start.generation) for cohort, start in memory.starting.items()
            if start.asked() and memory.checking.get(cohort) != start.generation
            and now.mono - start.looked_at >= START_LOOK_S]


def judge_start(check: observe.StartCheck, start: Start | None, now: Now) -> list[Action]:
    """A look at a start's unit, judged at the time it answered, against the start still in progress; a look at
    a start that is gone meanwhile lets go of what it found."""
    if start is None or start.generation != check.generation:
        return [Untrack(check.tracked)] if check.tracked is not None else []
    if check.error:  # reported (the same error at most every ERROR_REPORT_S); the next tick looks again
        return [ReportFault("start-check-failed", check.cohort, check.generation, check.error)]
    return start_progress(check.cohort, start, check.tracked, check.unit, now)


def health_probe_timeout(rank: LocalRank, hang: HangPolicy, now: Now) -> float:
    """How long to wait for /health: at most until the leader would count as hung (0.05-0.5 s)."""
    left = hang.health_deadline(rank.healthy_at) - now.mono if rank.healthy_at is not None else 0.5
    return min(0.5, max(0.05, left))


def progress_due(rank: LocalRank, hang: HangPolicy, now: Now) -> bool:
    """Read the leader's /metrics now (HangPolicy.progress_every_s since the last read)?"""
    return now.mono - rank.progress_at >= hang.progress_every_s


def leader_probes_due(memory: NodeMemory, hang: HangPolicy, now: Now) -> list[Action]:
    """A probe of each leader rank with none out: /health within what is left before it would count as hung, the
    progress metrics too when they are due. Adopted ranks whose generation is not known yet (etcd not read since
    the agent started) and headless ranks are not probed."""
    actions: list[Action] = []
    for rank in memory.ranks.values():
        if not rank.generation or not rank.leader or rank.cohort in memory.probing:
            continue
        actions.append(ProbeLeader(rank.cohort, rank.generation, health_probe_timeout(rank, hang, now),
                                   PROGRESS_TIMEOUT_S if progress_due(rank, hang, now) else None))
    return actions


def judge_rank(rank: LocalRank, sample: ProgressSample | None | bool, health: HealthAnswer | None, now: Now,
               hang: HangPolicy, etcd_lost_since: float | None) -> list[Action]:
    """A leader's signals, as real engines give them (docs/detection.md): hung (no 200 from /health for
    health_timeout_s since the last one) or its generation stalled (requests running and vLLM's token counter
    still for progress_stall_s: a rank stuck in a collective, wherever it runs, stops the leader's steps).
    ``sample``: this read of the leader's /metrics (None: it has no progress metrics; False: not read now, or
    no answer). A rank is judged on /health only once it answered 200 since the agent tracks it: weight loading
    takes as long as it takes. Headless ranks show nothing but their exit (vLLM's /health stays 200 when one
    hangs: vllm#16259). An etcd outage never costs a serving cohort: the stall clock does not run while etcd is
    away (the engines wait on it too), and nothing is torn down before the generation is declared in etcd."""
    actions: list[Action] = []
    verdict = None
    if sample is not False:
        if sample is not None:  # while etcd is away the clock starts afresh at each sample: Dynamo's engines wait
            # on etcd and NATS too, so a counter still meanwhile is no hang; judged from when etcd answers again
            previous = rank.progress if etcd_lost_since is None else None
            verdict = progress.judge(previous, sample, now.mono, hang)
        actions.append(NoteProgress(rank.cohort, verdict.observation if verdict else None, now.mono))
    healthy_at = rank.healthy_at
    if health is not None and health.ok:
        actions.append(MarkHealthy(rank.cohort, health.at))
        healthy_at = health.at
    health_silent = None
    if health is not None and not health.ok and healthy_at is not None:
        health_silent = silence(healthy_at, 0.0, health.at)
    still = verdict.still_s if verdict is not None and verdict.observation.running else None
    reason = hang.judge(still, health_silent)
    if reason is None:
        if health_silent is not None:  # decide at the deadline, not a check period later
            actions.append(WakeAt(hang.health_deadline(healthy_at or 0.0)))
        return actions
    if reason == GENERATION_STALLED and verdict is not None:
        evidence = {**rank.culprit("progress", progress.describe(verdict, hang)), "still_s": round(verdict.still_s, 3)}
    else:
        evidence = rank.culprit("health", f"/health gave no 200 for {health_silent or 0.0:.1f} s "
                                          f"(health_timeout_s {hang.health_timeout_s:g})")
    actions.append(Declare(rank.cohort, rank.generation, reason, evidence))
    return actions


def gpu_faults(faults: list[GpuFault], memory: NodeMemory, active: Active | None, host: str, failover: Failover,
               now: Now) -> list[Action]:
    """GPU health events of this node (control/gpu_watch.py), by the action NVIDIA's Xid catalog gives them
    (common/xid_table.py). ``none``: recorded only. ``restart-app``: the application's GPU context failed: the
    serving cohort's rank here (every rank here when nothing is known to serve) is killed at once and its
    generation declared failed (gpu-xid); a parked shadow takes over as usual. ``reset-gpu`` / ``node-service``:
    the GPU itself is out of service: every rank here is killed and declared (gpu-fault) and the node is fenced
    (a record in etcd): every cohort has a rank on every node, so no cohort can serve, none is promoted or
    relaunched until an operator has the GPU reset or the node replaced and unfences it
    (``playbooks/failover.yml -e unfence=<node>``). Which GPU a rank uses is not asked: every cohort's rank on a
    node uses the node's GPUs (the plan's gms_engine.gpus_per_node)."""
    actions: list[Action] = []
    for fault in faults:
        fields = {"gpu": fault.gpu_uuid, "pci_bus": fault.pci_bus, "xid": fault.xid, "action": fault.action,
                  "source": fault.source, "detail": fault.detail}
        actions.append(Record("gpu-event", fields=fields))
        if fault.action == NONE:
            continue
        ranks = list(memory.ranks.values())
        serving = memory.ranks.get(active.cohort) if active is not None else None
        if not fault.fails_gpu and serving is not None and serving.generation == active.generation:
            ranks = [serving]
        reason = GPU_FAULT if fault.fails_gpu else GPU_XID
        for rank in sorted(ranks, key=lambda r: r.cohort):
            evidence = {**rank.culprit("gpu", f"GPU {fault.gpu_uuid or fault.pci_bus}: {fault.detail}"),
                        "gpu": fault.gpu_uuid, "xid": fault.xid, "gpu_action": fault.action}
            actions += [TearDown(rank, now.wall, float(failover.term_grace_s)),
                        Declare(rank.cohort, rank.generation, reason, evidence)]
        if fault.fails_gpu and memory.fence is None:
            record = {**fields, "since": now.wall, "node": host}
            actions += [Fence(host, record),
                        Record("node-fenced", fields={**fields, "detail": (
                            f"GPU {fault.gpu_uuid or fault.pci_bus} needs {fault.action}: {fault.detail}. Every "
                            f"cohort has a rank on {host}, so no cohort can serve until the GPU is reset or {host} "
                            f"is replaced; then: ansible-playbook playbooks/failover.yml -e unfence={host}")})]
    return actions


def refence(view: DeploymentView, memory: NodeMemory, host: str) -> list[Action]:
    """This node's fence record, written again while etcd lacks it (it was away when the fault came); once etcd
    had it, its absence is an operator's unfence, which the node forgets its fence for."""
    if memory.fence is None or host in view.fenced:
        return []
    if memory.fence_written:
        return [ClearFence(), Record("fence-cleared", fields={"node": host})]
    return [Fence(host, memory.fence)]


def gms_exited(now: Now) -> list[Action]:
    """Engines keep the weights they mapped and go on serving; a new import would find the restarted server
    empty. Tell the driver, which has the writer (cohort 0) republish them (driver_duties.republish_weights)."""
    return [Record("gms-lost"), ReportGmsLost(now.wall)]


# --- the duties, in the order a tick needs them -------------------------------------------------------------------
class NodeDuties:
    def __init__(self, plan: Plan, host: str, memory: NodeMemory, execute: Callable[[list[Action]], None]) -> None:
        self.plan = plan
        self.host = host
        self.node_rank = plan.node(host).rank
        self.failover = plan.failover
        self.hang = HangPolicy.of(plan.failover)
        self.memory = memory
        self.execute = execute

    def on_slot_changes(self, slots: list[Slot]) -> None:
        """The hot path: tear down at once what a watch event says has failed (no read of etcd first)."""
        for slot in slots:
            self.execute(slot_failed(slot, self.memory, self.failover))

    def on_notices(self, notices: list[FailureNotice]) -> None:
        """The other hot path: tear down at once what another node's agent declared and told this one."""
        for notice in notices:
            self.execute(notice_failed(notice, self.memory, self.failover, Now.read()))

    def on_rank_exit(self, cohort: int, now: Now) -> None:
        rank = self.memory.ranks.get(cohort)
        if rank is not None:
            self.execute(rank_exited(rank, now, self.failover))

    def track_starts(self, now: Now) -> None:
        """Look at each start's unit, in a thread per start (the executor's): the loop never waits on systemctl."""
        self.execute(starts_to_check(self.memory, now))

    def judge_starts(self, checks: list[observe.StartCheck]) -> None:
        """Judge the starts whose looks answered, at the time they are judged."""
        for check in checks:
            if self.memory.checking.get(check.cohort) == check.generation:
                del self.memory.checking[check.cohort]
            now = Now.read()
            start = self.memory.starting.get(check.cohort)
            if start is not None:
                start.looked_at = now.mono
            self.execute(judge_start(check, start, now))

    def finish_teardowns(self, now: Now) -> None:
        alive = {c: observe.rank_alive(t.rank) for c, t in self.memory.terminating.items()}
        self.execute(teardowns_due(self.memory, alive, now))

    def reconcile(self, view: DeploymentView, now: Now) -> None:
        """Make this node's ranks match the slot records."""
        self.execute(report_invalid(view, self.memory))
        self.execute(refence(view, self.memory, self.host))
        self.execute(settle_adopted(view, self.memory, now))
        self.execute(publish_due(view, self.memory, self.host))
        for entry in view.slots.values():
            slot = entry.slot
            self.execute(abandon_stale_start(slot, self.memory))
            if slot.state in (FAILED, DEAD):
                leftover = None
                if slot.cohort not in self.memory.ranks and slot.cohort not in self.memory.terminating:
                    leftover = self.untracked(slot.cohort, slot.generation)
                self.execute(settle_failed(slot, self.memory, self.failover, now, leftover))
            else:
                self.execute(retire_leftover(slot, self.memory, self.failover, now))
                self.execute(launch_due(slot, self.memory, now))

    def untracked(self, cohort: int, generation: int) -> LocalRank | None:
        """Processes in ``cohort``'s unit that the agent does not track (observe.untracked). Read on every view
        with the cohort failed or dead, on every node, while the other nodes still tear down: where the unit's
        cgroup is known and empty, that is a file read rather than a ``systemctl show`` (9-55 ms on a loaded
        testbed host, and CPU the other agents' teardowns wait for on a small machine)."""
        cgroup = self.memory.unit_cgroups.get(cohort)
        if cgroup is not None and not observe.cgroup_alive(cgroup):
            return None
        return observe.untracked(self.plan, self.host, cohort, generation)

    def check_health(self) -> None:
        """Ask each leader rank's /health and, when due, its progress metrics (headless ranks have neither), one
        probe at a time per rank, each in a thread of its own (the executor's): the loop never waits on an
        engine. The answers are judged when they come (judge_probes)."""
        now = Now.read()
        self.execute(leader_probes_due(self.memory, self.hang, now))

    def judge_probes(self, probes: list[observe.LeaderProbe]) -> bool:
        """Judge the leaders whose probes answered, on what they read, at the time they are judged; an answer
        about a generation that is gone (torn down meanwhile) is dropped. A probe that failed unexpectedly is
        reported (``leader-probe-failed``, the same error at most every ERROR_REPORT_S) and its rank is probed
        again as usual: the rest of the tick goes on (an error raised here used to end the tick before its
        teardowns, reconcile and drive, and the loop then slept a tick). True when a leader answered its first
        200 (a launch the driver marks running: driver_duties.running_due)."""
        first_health = False
        for probe in probes:
            if self.memory.probing.get(probe.cohort) == probe.generation:
                del self.memory.probing[probe.cohort]
            rank = self.memory.ranks.get(probe.cohort)
            if rank is None or rank.generation != probe.generation:
                continue
            if probe.error:
                self.execute([ReportFault("leader-probe-failed", probe.cohort, probe.generation, probe.error)])
                continue
            now = Now.read()
            if probe.progress_read and probe.sample is False:
                self.execute([NoteProgress(rank.cohort, rank.progress, now.mono)])  # asked, no answer: next period
            unhealthy = rank.healthy_at is None
            self.execute(judge_rank(rank, probe.sample, probe.health, now, self.hang, self.memory.etcd_lost_since))
            first_health = first_health or (unhealthy and rank.healthy_at is not None)
        return first_health

    def on_gpu_faults(self, faults: list[GpuFault], view: DeploymentView | None, now: Now) -> None:
        active = view.active if view is not None else None
        self.execute(gpu_faults(faults, self.memory, active, self.host, self.failover, now))

    def on_gms_exit(self, now: Now) -> None:
        self.execute(gms_exited(now))
