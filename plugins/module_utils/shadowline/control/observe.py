"""The node's local observations, read by the agent before it decides: systemd's view of a unit, a leader's
/health answer, a rank's progress signal, a cgroup's processes. Reads only (opening a pidfd is the one handle
it takes: a tracked rank's exit wakes the loop)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..cluster.cohort_state import leader_view
from ..common.etcd_client import EtcdError
from ..common.http import http_get
from ..common.proc import (
    alive,
    argv_process,
    cgroup_pids,
    listening_ports,
    monotonic_to_unix,
    pidfd_open,
    process_environ,
    unit_properties,
)
from ..common.progress import ProgressSample, parse_sample
from ..deployment.plan import Plan
from ..deployment.units import CONFIG_ENV, engine_dropin_dir, installed_config
from .memory import LocalRank, PromotionSeen


@dataclass(frozen=True)
class UnitState:
    active_state: str
    sub_state: str = "?"
    result: str = "?"


@dataclass(frozen=True)
class HealthAnswer:
    ok: bool  # 200 from the leader's /health
    at: float  # monotonic, when the answer (or the timeout) came


def environment_value(assignments: list[str], name: str) -> str:
    """The value of ``name`` among ``KEY=VALUE`` assignments ("" when it is not among them)."""
    prefix = f"{name}="
    return next((a[len(prefix):] for a in assignments if a.startswith(prefix)), "")


def running_config(pid: int) -> str:
    """The cohort configuration digest a rank's process runs (its environment; "" when unreadable)."""
    return environment_value([v.decode(errors="replace") for v in process_environ(pid)], CONFIG_ENV)


def installed_configs(plan: Plan) -> dict[int, str]:
    """Each cohort's configuration digest as its drop-in on this node's disk holds it ("" where it cannot be
    read): what the driver writes into a launching slot (driver_duties.relaunch_due), and what a node's start
    is checked against (node_duties.start_refusal). A file read per cohort, no systemctl: a start is on the
    relaunch's path, where every node's CPU goes to the engines waking. The files are what systemd runs once it
    has reloaded them (the engine role reloads right after it installs them); a rank started in between runs the
    loaded one, which the driver finds (driver_duties.mixed_generations)."""
    return {cohort: installed_config_of(plan, cohort) for cohort in plan.cohort_ids}


def installed_config_of(plan: Plan, cohort: int) -> str:
    try:
        with open(f"{engine_dropin_dir(plan, cohort)}/plan.conf", encoding="utf-8") as handle:
            return installed_config(handle.read())
    except OSError:
        return ""


def unit_state(unit: str) -> UnitState:
    props = unit_properties(unit, "ActiveState", "SubState", "Result")
    return UnitState(props.get("ActiveState", "unknown"), props.get("SubState", "?"), props.get("Result", "?"))


def gms_server_pid(plan: Plan) -> int | None:
    """The main process of this host's GMS server, while its unit is active (in a container: once podman started
    it), else None: what a node's agent watches through a pidfd and a spare's agent reports as up."""
    props = unit_properties(plan.unit_name("gms"), "MainPID", "ActiveState", "ControlGroup")
    pid = argv_process(props, plan.container)
    return pid if props.get("ActiveState") == "active" and pid else None


def track(plan: Plan, host: str, cohort: int, generation: int, *, engine_only: bool = False) -> LocalRank | None:
    """This node's rank of ``cohort`` as systemd runs it, with a pidfd on its main process (in container mode the
    engine's, the container's first process); None when the unit is not active (or its main process exited
    meanwhile), and with ``engine_only`` while podman has not started the container yet."""
    unit = plan.unit_name("engine", cohort)
    props = unit_properties(unit, "MainPID", "ActiveState", "ControlGroup", "ExecMainStartTimestampMonotonic")
    # in a container unit, the engine itself once its container runs (podman's own exit trails it by ~0.8 s);
    # ``engine_only``: a start not yet tracked waits for it rather than tracking podman for the rank's whole life
    pid = argv_process(props, plan.container)
    if plan.container and not pid:
        if engine_only:
            return None
        pid = argv_process(props, False)  # podman, until the container runs
    if props.get("ActiveState") != "active" or not pid:
        return None
    pidfd = pidfd_open(pid)
    if pidfd is None:  # exited between systemctl's answer and now: the unit is about to be inactive
        return None
    started = monotonic_to_unix(props.get("ExecMainStartTimestampMonotonic", "0")) or time.time()
    return LocalRank(cohort=cohort, generation=generation, unit=unit, pid=pid, pidfd=pidfd,
                     cgroup=props.get("ControlGroup") or None, leader=plan.node(host).rank == 0, started=started,
                     node=host, node_rank=plan.node(host).rank, config=running_config(pid))


@dataclass(frozen=True)
class StartCheck:
    """What one look at a start's unit found: its rank running (``tracked``, with a pidfd), else the unit's state."""
    cohort: int
    generation: int
    tracked: LocalRank | None
    unit: UnitState | None  # None with a rank tracked, or when the look itself failed (``error``)
    error: str = ""


def check_start(plan: Plan, host: str, cohort: int, generation: int) -> StartCheck:
    """``track`` the start's rank (its engine, in container mode); the unit's state when it does not run yet."""
    try:
        tracked = track(plan, host, cohort, generation, engine_only=True)
        unit = None if tracked else unit_state(plan.unit_name("engine", cohort))
    except Exception as err:  # noqa: BLE001 (a look that died unheard would leave the start unjudged for good)
        return StartCheck(cohort, generation, None, None, f"{type(err).__name__}: {err}")
    return StartCheck(cohort, generation, tracked, unit)


def look_at_promotion(plan: Plan, cohort: int, want_state: bool, cgroup: str | None,
                      registrations: Callable[[int, set[int]], list[int]]) -> PromotionSeen:
    """What is still to be found of a promoted cohort: its leader's failover state (``want_state``), then, once it
    is active, its registration in discovery (the leases of the worker whose ports the rank's cgroup listens on).
    Never raises: what could not be read is not seen (the next look reads it again); anything else that went
    wrong is said in ``error`` (the executor records it)."""
    state, state_at = None, 0.0
    try:
        if want_state:
            view = leader_view(plan, cohort, 0.5)
            state, state_at = (view.state if view is not None else None), time.time()
            if state != "active":
                return PromotionSeen(state=state, state_at=state_at)
        ports = listening_ports(cgroup_pids(cgroup)) if cgroup else set()
        leases = tuple(registrations(cohort, ports))
    except (EtcdError, OSError, ValueError):
        return PromotionSeen(state=state, state_at=state_at)
    except Exception as err:  # noqa: BLE001 (a look that died unheard would leave the promotion unlooked at for good)
        return PromotionSeen(state=state, state_at=state_at, error=f"{type(err).__name__}: {err}")
    return PromotionSeen(state=state, state_at=state_at, leases=leases, leases_at=time.time())


@dataclass(frozen=True)
class LeaderProbe:
    """What one probe of a leader rank read: its /health and, when asked and it answered 200, its progress
    metrics (``sample`` as leader_progress returns it; False when not read or not answered)."""
    cohort: int
    generation: int
    health: HealthAnswer | None  # None: the probe itself failed (``error``)
    sample: ProgressSample | None | bool
    progress_read: bool  # the progress metrics were asked for (a False sample then means: no answer)
    error: str = ""


def probe_leader(plan: Plan, cohort: int, generation: int, timeout: float,
                 progress_timeout: float | None) -> LeaderProbe:
    """/health within ``timeout``, then, when ``progress_timeout`` is given and it answered 200, the progress
    metrics within that."""
    try:
        health = leader_health(plan, cohort, timeout)
        read = progress_timeout is not None and health.ok
        sample = leader_progress(plan, cohort, progress_timeout) if read else False
    except Exception as err:  # noqa: BLE001 (a probe that died unheard would leave the rank unjudged for good)
        return LeaderProbe(cohort, generation, None, False, False, f"{type(err).__name__}: {err}")
    return LeaderProbe(cohort, generation, health, sample, read)


def leader_health(plan: Plan, cohort: int, timeout: float) -> HealthAnswer:
    answer = http_get(f"{plan.cohort(cohort).system_url}/health", timeout)
    return HealthAnswer(ok=answer is not None and answer[0] == 200, at=time.monotonic())


def leader_progress(plan: Plan, cohort: int, timeout: float) -> ProgressSample | None | bool:
    """The leader's generation progress from its system port's /metrics (vLLM's running requests and generated
    tokens, common/progress.py): a sample; None when the metrics have none (not a vLLM engine, or still
    starting); False when /metrics did not answer."""
    path = plan.engine.progress_metrics_path
    if path is None:
        return None
    answer = http_get(f"{plan.cohort(cohort).system_url}{path}", timeout)
    if answer is None or answer[0] != 200:
        return False
    return parse_sample(answer[1])


def cgroup_alive(cgroup: str | None) -> bool:
    return bool(cgroup and cgroup_pids(cgroup))


def rank_alive(rank: LocalRank) -> bool:
    """Is anything of the rank still running: a process in its unit's cgroup (or, without one, its main process)."""
    return cgroup_alive(rank.cgroup) if rank.cgroup else alive(rank.pid)


def untracked(plan: Plan, host: str, cohort: int, generation: int) -> LocalRank | None:
    """Processes of ``cohort``'s unit that the agent does not track (left by a teardown before the agent
    restarted, or started behind its back), as a rank to tear down; None when the unit's cgroup is empty."""
    unit = plan.unit_name("engine", cohort)
    props = unit_properties(unit, "MainPID", "ControlGroup")
    cgroup = props.get("ControlGroup") or None
    if not cgroup_alive(cgroup):
        return None
    return LocalRank(cohort=cohort, generation=generation, unit=unit, pid=int(props.get("MainPID", "0") or 0),
                     pidfd=None, cgroup=cgroup, leader=plan.node(host).rank == 0, started=time.time(),
                     node=host, node_rank=plan.node(host).rank)
