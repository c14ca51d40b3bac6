"""What a drill does and reads on one node (as root): fault injection, the engine units' processes, the event
log, the leaders' failover state, the GMS server, the slots and the lock. Called by the drill modules
(``fault_inject``, ``drill_probe``) and by scripts/bench-failover through ``python -m shadowline.drill.node``.

A process is named by (pid, start time in clock ticks since boot), so a pid the kernel reused is never taken
for a survivor of the failed generation.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from ..cluster import discovery
from ..cluster.access import frontend_context, operator_etcd
from ..cluster.cohort_state import leader_view, lock_holder, unit_status
from ..common import console
from ..common.coordination import DEAD, RUNNING, Coordination
from ..common.etcd_client import EtcdError
from ..common.events import read_events
from ..common.http import http_get
from ..common.policy import NODE_FENCED
from ..common.proc import (
    cgroup_pids,
    command_line,
    monotonic_to_unix,
    start_ticks,
    stopped,
    unit_cgroup,
    unit_properties,
)
from ..control.failover import unfence
from ..deployment.plan import Plan, sole_replica
from ..standin.gpu_events import append_fake_event, fake_events_path
from .faults import FAULTS, DrillError, cut_unit_name, fake_gpu, fault, rank_fault_file

CUT_STATE = "/run/shadowline-drill-cut-{deployment}.json"


# --- processes ---------------------------------------------------------------------------------------------------
def engine_processes(plan: Plan) -> dict[str, dict[str, Any]]:
    """For every cohort, this node's engine unit: main pid and every process of its cgroup."""
    result = {}
    for cohort in plan.cohort_ids:
        unit = plan.unit_name("engine", cohort)
        status = unit_status(unit, plan.container)
        cgroup = unit_cgroup(unit)
        processes = []
        for pid in cgroup_pids(cgroup) if cgroup else []:
            ticks = start_ticks(pid)
            if ticks is not None:
                processes.append({"pid": pid, "start": ticks, "cmd": " ".join(command_line(pid))[:160]})
        result[str(cohort)] = {"unit": unit, "main_pid": status["pid"],
                               "active": status["active_state"], "processes": processes}
    return result


def survivors(snapshot: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The processes of a snapshot (``engine_processes``) that are still alive, with their cohort."""
    alive = []
    for cohort, unit in snapshot.items():
        for proc in unit.get("processes", []):
            if start_ticks(proc["pid"]) == proc["start"]:
                alive.append({"cohort": int(cohort), **proc, "stopped": stopped(proc["pid"])})
    return alive


def service_pid(plan: Plan, kind: str) -> int:
    return unit_status(plan.unit_name(kind))["pid"]


def service_state(plan: Plan, kind: str) -> dict[str, Any]:
    """A service unit's main pid and when systemd started that process (unix time, from its monotonic
    timestamp: /proc's boot time is whole seconds)."""
    props = unit_properties(plan.unit_name(kind), "MainPID", "ExecMainStartTimestampMonotonic")
    pid = int(props.get("MainPID", "0") or 0)
    at = monotonic_to_unix(props.get("ExecMainStartTimestampMonotonic", "0"))
    return {"pid": pid, "started_at": round(at, 3) if pid and at else None}


# --- the leader node: failover state, lock, slots ------------------------------------------------------------------
def leader_views(plan: Plan, timeout_s: float = 1.0) -> dict[str, dict[str, Any]]:
    """Each cohort leader's failover state from its own metrics (call on the leader node)."""
    views = {}
    for cohort in plan.cohort_ids:
        view = leader_view(plan, cohort, timeout_s)
        views[str(cohort)] = {
            "state": view.state if view else None,
            "entered": view.state_entered if view else None,
            "durations": view.last_state_duration if view else {},
        }
    return views


def slots(plan: Plan) -> dict[str, dict[str, Any]] | None:
    """The slot records in etcd ({cohort: {generation, state, reason, attempts}}), None when etcd is away."""
    try:
        records = Coordination(operator_etcd(plan), plan.deployment, sole_replica(plan)).slots()
    except EtcdError:
        return None
    return {str(c): {"generation": s.generation, "state": s.state, "reason": s.reason, "attempts": s.attempts,
                     "since": s.since} for c, (s, _rev) in records.items()}


def workers(plan: Plan) -> dict[str, str | None]:
    """Every Dynamo worker registered in discovery, the whole deployment's (every replica's): {instance id (hex):
    the host address of its request plane}, which names its replica's leader node (drill/serving.py); {} when
    etcd is away."""
    try:
        return {reg.instance_id: reg.host for reg in discovery.registrations(operator_etcd(plan))}
    except EtcdError:
        return {}


def steady(plan: Plan) -> tuple[str | None, dict[str, Any]]:
    """Is the deployment ready for a drill? (None, state) when every slot runs, a cohort holds the lock and
    every other leader is parked; else (what is missing, state)."""
    state: dict[str, Any] = {"lock_holder": lock_holder(plan.lock_path), "slots": slots(plan),
                             "leaders": leader_views(plan)}
    if state["slots"] is None:
        return "etcd does not answer", state
    for cohort in plan.cohort_ids:
        slot = state["slots"].get(str(cohort))
        if slot is None or slot["state"] != RUNNING:
            return f"cohort {cohort} is {slot['state'] if slot else 'unknown'}, not running", state
        if slot["attempts"]:  # a drill now would count toward the crash-loop limit
            return (f"cohort {cohort} failed soon after its last launch (attempts {slot['attempts']}); "
                    f"waiting until it has run gms_failover.stable_after_s", state)
    if state["lock_holder"] is None:
        return "no cohort holds the failover lock", state
    serving = state["lock_holder"].rsplit("-", 1)[-1]
    for cohort, view in state["leaders"].items():
        want = "active" if cohort == serving else "standby"
        if view["state"] != want:
            return f"cohort {cohort}'s leader is {view['state']}, not {want}", state
    return None, state


def wait_steady(plan: Plan, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        missing, state = steady(plan)
        if missing is None:
            return state
        if time.monotonic() >= deadline:
            raise DrillError(f"the deployment is not steady after {timeout_s:.0f} s: {missing}. Fix: run "
                             "playbooks/status.yml, and playbooks/failover.yml -e cohort=<c> for a dead slot")
        time.sleep(0.2)


def settled(plan: Plan, since: float, before: dict[str, Any], expect_failure: bool, min_s: float,
            events_path: str) -> str | None:
    """After a fault at ``since``: None once the agents are done and the deployment serves again (a failure was
    declared if one is expected, every slot runs again or is dead, the lock holder's leader is active and the
    frontend lists the model), else what is still going on."""
    if time.time() < since + min_s:
        return f"observing for {min_s:.1f} s"
    records = slots(plan)
    if records is None:
        return "etcd does not answer"
    if expect_failure:
        changed = [c for c, s in records.items() if s["generation"] != before.get(c, {}).get("generation")
                   or s["state"] != RUNNING]
        declared = [e for e in read_events(events_path, since) if e["event"] in ("generation-gone", "slot-dead")]
        if not changed and not declared:
            return "no failure declared yet"
    busy = [f"cohort {c} {s['state']}" for c, s in records.items() if s["state"] not in (RUNNING, DEAD)]
    if busy:
        return ", ".join(busy)
    holder = lock_holder(plan.lock_path)
    if holder is None:
        return "no cohort holds the failover lock"
    serving = holder.rsplit("-", 1)[-1]
    state = leader_views(plan).get(serving, {}).get("state")
    if state != "active":
        return f"cohort {serving} holds the lock but is {state}, not active"
    models = http_get(f"{plan.infra.frontend_url}/v1/models", 1.0, frontend_context(plan))
    if models is None or models[0] != 200 or f'"{plan.model_id}"' not in models[1]:
        return "the frontend does not list the model yet"
    return None


def held_for_fence(records: dict[str, dict[str, Any]] | None) -> str | None:
    """None once every slot is held for a fenced node (dead, node-fenced), else which are not yet."""
    if records is None:
        return "etcd does not answer"
    waiting = [f"cohort {c} {s['state']}" for c, s in records.items() if (s["state"], s["reason"]) != (DEAD, NODE_FENCED)]
    return ", ".join(waiting) + " (not yet held for the fenced node)" if waiting else None


def wait_settled(plan: Plan, since: float, before: dict[str, Any], expect_failure: bool, min_s: float,
                 timeout_s: float, fences: bool = False) -> tuple[bool, float, str]:
    events_path = plan.events_path
    deadline = time.time() + timeout_s
    seen = "not checked"
    while time.time() < deadline:
        if fences:  # a fault that fences a node is done once every slot is held: nothing serves until the unfence
            result = held_for_fence(slots(plan)) if time.time() >= since + min_s else "observing"
        else:
            result = settled(plan, since, before, expect_failure, min_s, events_path)
        if result is None:
            return True, time.time(), "settled"
        seen = result
        time.sleep(0.1)
    return False, time.time(), seen


# --- GMS -----------------------------------------------------------------------------------------------------
def gms_state(plan: Plan) -> dict[str, Any]:
    """The GMS server's pid and, where the backend can tell, whether it holds committed weights."""
    return {**service_state(plan, "gms"), "resident": plan.engine.weights_resident(plan.gms_dir)}


# --- fault injection ------------------------------------------------------------------------------------------
def sleep_until(at: float | None) -> float:
    """Wait until the machine's clock reads ``at``; returns how late we are (0 when on time)."""
    if at is None:
        return 0.0
    delay = at - time.time()
    if delay > 0:
        time.sleep(delay)
        return 0.0
    return -delay


def interface_of(address: str) -> str:
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == address:
            return fields[1]
    raise DrillError(f"no interface carries {address} on this node")


def inject(plan: Plan, host: str, name: str, cohort: int | None, at: float | None = None,
           cut_s: float = 5.0) -> dict[str, Any]:
    """Inject fault ``name`` on this node (``host``), at the time ``at``. Returns what was done, and when."""
    fault(name)
    node = plan.node(host)
    result: dict[str, Any] = {"fault": name, "host": host, "cohort": cohort, "pids": []}
    if name in ("kill-leader", "kill-worker", "kill-standby", "hang-leader", "hang-worker"):
        unit = plan.unit_name("engine", cohort)
        status = unit_status(unit, plan.container)
        if status["active_state"] != "active" or not status["pid"]:
            raise DrillError(f"{unit} does not run on {host}: nothing to {name}")
        result["unit"] = unit
        if name in ("hang-leader", "hang-worker"):
            cgroup = unit_cgroup(unit)
            pids = cgroup_pids(cgroup) if cgroup else []
            result["late_s"] = sleep_until(at)
            result["injected_at"] = time.time()
            for pid in pids:  # freeze the whole engine: leader, worker, everything of the unit
                try:
                    os.kill(pid, signal.SIGSTOP)
                    result["pids"].append(pid)
                except ProcessLookupError:
                    pass
            result["action"] = f"SIGSTOP {len(result['pids'])} processes of {unit}"
        else:
            result["late_s"] = sleep_until(at)
            result["injected_at"] = time.time()
            os.kill(status["pid"], signal.SIGKILL)
            result["pids"] = [status["pid"]]
            result["action"] = f"SIGKILL pid {status['pid']} ({unit} main process)"
    elif name == "stall-generation":
        path = rank_fault_file(plan, cohort or 0, node.rank)
        if path is None:
            raise DrillError(f"the {plan.backend} backend has no per-rank fault control file: nothing to {name}")
        result["late_s"] = sleep_until(at)
        result["injected_at"] = time.time()
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("hang-collective\n")
        result["control_file"] = path
        result["action"] = f"hang-collective through {path}"
    elif fault(name).gpu_xid:
        gpu = fake_gpu(plan, host)
        if gpu is None:
            raise DrillError(f"the {plan.backend} backend reads no fake GPU events: nothing to {name}")
        path = fake_events_path(plan.state_dir)
        result["late_s"] = sleep_until(at)
        result["injected_at"] = time.time()
        append_fake_event(path, gpu, fault(name).gpu_xid, f"drill {name}", when=result["injected_at"])
        result.update(gpu=gpu, xid=fault(name).gpu_xid, action=f"Xid {fault(name).gpu_xid} on {gpu} through {path}")
    elif name in ("kill-gms", "kill-agent"):
        unit = plan.unit_name("gms" if name == "kill-gms" else "agent")
        pid = unit_status(unit)["pid"]
        if not pid:
            raise DrillError(f"{unit} does not run on {host}: nothing to {name}")
        result["late_s"] = sleep_until(at)
        result["injected_at"] = time.time()
        os.kill(pid, signal.SIGKILL)
        result.update(unit=unit, pids=[pid], action=f"SIGKILL pid {pid} ({unit} main process)")
    elif name == "cut-node":
        result.update(cut_node(plan, host, node.address, at, cut_s))
    return result


def cut_node(plan: Plan, host: str, address: str, at: float | None, cut_s: float) -> dict[str, Any]:
    """Take the node's network down for ``cut_s`` seconds from a transient unit, which records when it really
    went down and up; the module answers first (its reply travels on that network)."""
    interface = interface_of(address)
    state_file = CUT_STATE.format(deployment=plan.deployment)
    lead = 0.5  # time for this module's answer to leave before the link goes down
    start_at = max(at or 0.0, time.time()) + lead
    script = (f"import json,subprocess,time\n"
              f"time.sleep(max(0.0,{start_at!r}-time.time()))\n"
              f"subprocess.run(['ip','link','set',{interface!r},'down'],check=True)\n"
              f"down=time.time()\n"
              f"open({state_file!r},'w').write(json.dumps({{'down':down}}))\n"
              f"time.sleep({float(cut_s)!r})\n"
              f"subprocess.run(['ip','link','set',{interface!r},'up'],check=True)\n"
              f"open({state_file!r},'w').write(json.dumps({{'down':down,'up':time.time()}}))\n")
    with open(state_file, "w", encoding="utf-8") as handle:
        handle.write("{}")
    subprocess.run(["systemd-run", "--quiet", "--collect", f"--unit={cut_unit_name(plan)}",
                    sys.executable, "-c", script], check=True, capture_output=True, text=True)
    return {"unit": cut_unit_name(plan), "interface": interface, "injected_at": start_at, "late_s": 0.0,
            "cut_s": cut_s, "action": f"ip link set {interface} down for {cut_s:g} s"}


def restore(plan: Plan, host: str, fault: str, cohort: int | None, pids: list[int] | None = None
            ) -> dict[str, Any]:
    """Undo what a drill left on this node: the control file, frozen leftovers, a link still down."""
    node = plan.node(host)
    done: list[str] = []
    result: dict[str, Any] = {"changed": False, "done": done}
    if fault == "stall-generation" and cohort is not None:
        path = rank_fault_file(plan, cohort, node.rank)
        if path and os.path.exists(path):
            os.unlink(path)
            done.append(f"removed {path}")
    if FAULTS[fault].fences:  # the GPU is "reset": back in service, the driver relaunches the held slots
        unfenced = unfence(plan, host)
        result["unfenced"] = unfenced["changed"]
        if unfenced["changed"]:
            done.append(f"unfenced {host} (was: {unfenced['fence'].get('detail', '?')})")
    if fault in ("hang-leader", "hang-worker"):
        for pid in pids or []:
            if stopped(pid):
                os.kill(pid, signal.SIGCONT)
                done.append(f"SIGCONT {pid} (still frozen: the agent did not tear it down)")
    if fault == "cut-node":
        state_file = CUT_STATE.format(deployment=plan.deployment)
        deadline = time.time() + 30
        while subprocess.run(["systemctl", "is-active", "--quiet", cut_unit_name(plan)], check=False).returncode == 0:
            if time.time() > deadline:
                subprocess.run(["systemctl", "stop", cut_unit_name(plan)], capture_output=True, check=False)
                done.append("stopped the cut unit")
                break
            time.sleep(0.1)
        interface = interface_of(node.address)
        link = subprocess.run(["ip", "-o", "link", "show", interface], capture_output=True, text=True, check=False).stdout
        if "state DOWN" in link or ",UP" not in link.split(">")[0]:
            subprocess.run(["ip", "link", "set", interface, "up"], check=True)
            done.append(f"ip link set {interface} up")
        try:
            with open(state_file, encoding="utf-8") as handle:
                result["cut"] = json.load(handle)
            os.unlink(state_file)
        except (OSError, ValueError):
            result["cut"] = {}
    result["changed"] = bool(done)
    return result


# --- command line (scripts/bench-failover runs it inside testbed hosts) ---------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shadowline.drill.node")
    parser.add_argument("--plan", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("what", choices=["inject", "restore", "processes", "steady", "settled", "gms", "views"])
    parser.add_argument("--fault")
    parser.add_argument("--cohort", type=int)
    parser.add_argument("--at", type=float)
    parser.add_argument("--cut-s", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    plan = Plan.load(args.plan)
    try:
        if args.what == "inject":
            out: Any = inject(plan, args.host, args.fault, args.cohort, args.at, args.cut_s)
        elif args.what == "restore":
            out = restore(plan, args.host, args.fault, args.cohort)
        elif args.what == "processes":
            out = engine_processes(plan)
        elif args.what == "steady":
            out = wait_steady(plan, args.timeout)
        elif args.what == "gms":
            out = gms_state(plan)
        else:
            out = leader_views(plan)
    except DrillError as err:
        console.out(json.dumps({"error": str(err)}))
        return 1
    console.out(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
