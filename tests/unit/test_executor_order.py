"""The order in which the agent's executor (control/executor.py) acts on a dead rank, against a real etcd on
loopback and a real process: the generation is declared failed in etcd before ``systemctl stop --no-block`` of
its unit runs (every other node's teardown waits for that declaration; the stop took 6.9 ms on a testbed host and
used to come first), and the rank's own confirmation is written before the stop too. ``systemctl`` here is a
script first on PATH that records, when it is called, what etcd holds for the slot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shadowline.common.coordination import RUNNING, Coordination, Keys, Slot
from shadowline.common.etcd_client import Etcd
from shadowline.common.events import EventLog
from shadowline.common.gpu_health import GpuFault, classify
from shadowline.common.proc import alive
from shadowline.control.agent_metrics import AgentMetrics
from shadowline.control.executor import Executor, Schedule
from shadowline.control.failure_notices import Notifier
from shadowline.control.memory import LocalRank, NodeMemory
from shadowline.control.node_duties import gpu_faults, rank_exited, teardowns_due
from shadowline.control.observe import rank_alive
from shadowline.control.view import Now
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan import Plan
from shadowline.deployment.plan_builder import build_plan
from tests.loopback import ETCD, start_etcd

from .helpers import hostvars

FAKE_SYSTEMCTL = '''#!{python}
"""systemctl for the test: appends its arguments and the slot record etcd holds now to {log}."""
import base64, json, sys, urllib.request
body = json.dumps({{"key": base64.b64encode({key!r}.encode()).decode()}}).encode()
with urllib.request.urlopen(urllib.request.Request("{url}/v3/kv/range", data=body), timeout=5) as answer:
    kvs = json.loads(answer.read()).get("kvs", [])
held = json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None
gone = {gone!r}
body = json.dumps({{"key": base64.b64encode(gone.encode()).decode(),
                    "range_end": base64.b64encode(gone[:-1].encode() + bytes([ord(gone[-1]) + 1])).decode()}}).encode()
with urllib.request.urlopen(urllib.request.Request("{url}/v3/kv/range", data=body), timeout=5) as answer:
    confirmed = int(json.loads(answer.read()).get("count", 0))
with open({log!r}, "a") as out:
    out.write(json.dumps({{"argv": sys.argv[1:], "slot": held, "confirmations": confirmed}}) + "\\n")
'''


def two_nodes(tmp_path: Path) -> tuple[Plan, list[str]]:
    """A plain two-node plan (etcd without TLS or authentication here) and its hosts."""
    hv, hosts = hostvars(2, gms_insecure=True)
    contract, problems = parse_contract(hv, hosts)
    assert contract is not None, problems
    return build_plan(contract, state_dir=str(tmp_path / "state"), config_dir=str(tmp_path / "config")), hosts


def node_executor(plan: Plan, host: str, etcd: Etcd, events: EventLog, node: NodeMemory, cohort: int,
                  notifier: Notifier | None = None) -> Executor:
    """The executor of a node agent (no driver) on ``host``, as the agent builds it."""
    return Executor(plan, host, etcd, events, AgentMetrics(plan.deployment, host, [cohort]), node, None, Schedule(),
                    os.open(os.devnull, os.O_WRONLY), notifier)


def test_a_dead_rank_is_declared_and_confirmed_before_its_unit_is_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if not os.path.exists(ETCD):
        pytest.skip("no etcd binary")
    plan, hosts = two_nodes(tmp_path)
    server = start_etcd(tmp_path)
    try:
        etcd = Etcd(server.url)
        keys = Keys(plan.deployment, 0)
        cohort, generation = 1, 3
        assert Coordination(etcd, plan.deployment, 0).create_slot(Slot(cohort, generation, RUNNING))
        calls = tmp_path / "systemctl.log"
        bindir = tmp_path / "bin"
        bindir.mkdir()
        script = bindir / "systemctl"
        script.write_text(FAKE_SYSTEMCTL.format(python=sys.executable, log=str(calls), key=keys.slot(cohort),
                                                gone=keys.gone(cohort, generation), url=server.url))
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")

        process = subprocess.Popen(["sleep", "60"])  # the rank's main process, with no cgroup of its own: it dies
        unit = plan.unit_name("engine", cohort)
        rank = LocalRank(cohort=cohort, generation=generation, unit=unit, pid=process.pid, pidfd=None, cgroup=None,
                         leader=True, started=time.time(), node=hosts[0])
        node = NodeMemory(ranks={cohort: rank})
        events = EventLog(str(tmp_path / "events.jsonl"), hosts[0], journal=None)
        executor = node_executor(plan, hosts[0], etcd, events, node, cohort)
        process.kill()
        process.wait()
        executor(rank_exited(rank, Now.read(), plan.failover))  # what the loop does with a pidfd's exit
        executor.flush()  # at the end of the tick
        assert not alive(process.pid)
        stops = [json.loads(line) for line in calls.read_text().splitlines()]
        assert [c["argv"] for c in stops] == [["stop", "--no-block", unit]], stops
        (stop,) = stops
        assert stop["slot"]["state"] == "failed" and stop["slot"]["generation"] == generation, \
            f"systemctl stop ran before the declaration reached etcd: {stop['slot']}"
        assert stop["confirmations"] == 1, "systemctl stop ran before this node's confirmation reached etcd"
        logged = [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert {"ranks-gone", "failure-declared"} <= set(logged), logged
    finally:
        server.stop()


FREEZER = Path("/sys/fs/cgroup/freezer")
SYSTEMD = Path("/sys/fs/cgroup/systemd")  # one of the hierarchies the agent reads a unit's cgroup in (proc.py)


def test_the_declaration_does_not_wait_for_the_killed_processes_to_end(tmp_path: Path):
    """The rest of a dead rank is sent SIGKILL and the generation declared at once; the rank is confirmed gone only
    once its cgroup is empty. Here a process of the rank is held by a v1 freezer cgroup (as fault matrix row 9
    does), so SIGKILL does not end it until it is thawed: the kernel's time to end what SIGKILL hit (long for a
    process with GPU memory to release), which the declaration used to wait for (up to 0.1 s). etcd
    is away, so the declaration is deferred at once: the executor's own time is measured, not etcd's."""
    if not (FREEZER.is_dir() and SYSTEMD.is_dir()) or os.geteuid() != 0:
        pytest.skip("needs root and the v1 freezer and name=systemd cgroup hierarchies")
    plan, hosts = two_nodes(tmp_path)
    name = f"shadowline-unit-test-{os.getpid()}"
    unit_cgroup, freezer = SYSTEMD / name, FREEZER / name
    unit_cgroup.mkdir()
    freezer.mkdir()
    process = subprocess.Popen(["sleep", "60"])
    try:
        (unit_cgroup / "cgroup.procs").write_text(str(process.pid))
        (freezer / "cgroup.procs").write_text(str(process.pid))
        (freezer / "freezer.state").write_text("FROZEN")
        cohort, generation = 1, 3
        rank = LocalRank(cohort=cohort, generation=generation, unit=plan.unit_name("engine", cohort),
                         pid=process.pid, pidfd=None, cgroup=f"/{name}", leader=True, started=time.time(),
                         node=hosts[0])
        node = NodeMemory(ranks={cohort: rank}, etcd_lost_since=time.monotonic())
        log = tmp_path / "events.jsonl"
        executor = node_executor(plan, hosts[0], Etcd("http://127.0.0.1:9"),
                                 EventLog(str(log), hosts[0], journal=None), node, cohort)
        executor(rank_exited(rank, Now.read(), plan.failover))
        events = {e["event"]: e["time"] for e in map(json.loads, log.read_text().splitlines())}
        waited = events["declare-deferred"] - events["rank-exited"]
        assert waited < 0.05, f"the declaration waited {waited:.3f} s for the killed processes to end"
        assert rank_alive(rank), "the frozen process ended: the test proves nothing"
        assert cohort in node.terminating and "ranks-gone" not in events, "confirmed gone while a process of it runs"
        (freezer / "freezer.state").write_text("THAWED")  # SIGKILL, pending, now ends it
        process.wait(timeout=10)
        executor(teardowns_due(node, {cohort: rank_alive(rank)}, Now.read()))  # the loop's next pass
        assert cohort not in node.terminating
        assert "ranks-gone" in {json.loads(line)["event"] for line in log.read_text().splitlines()}
    finally:
        if process.poll() is None:
            (freezer / "freezer.state").write_text("THAWED")
            process.kill()
            process.wait(timeout=10)
        freezer.rmdir()
        unit_cgroup.rmdir()


def test_every_notice_of_a_gpu_fault_is_sent_before_its_first_compare_and_swap(tmp_path: Path):
    """A GPU fault fails every cohort on the GPU at once. Its failure notices all go out before the first
    declaration's compare-and-swap in etcd: sent one per declaration, the second cohort's notice waited for the
    first cohort's etcd write, and meanwhile the other nodes had killed the serving leader (freeing the failover
    lock) while this node's parked shadow on the faulty GPU still ran, free to take the lock (CI: the
    gpu-xid-fatal drill left a second worker registered). Here with a real etcd and the agent's real notifier,
    its sender threads not started so that the notices wait in their queues: each notice's time is when it was
    sent, each failed slot's time when its compare-and-swap was written."""
    if not os.path.exists(ETCD):
        pytest.skip("no etcd binary")
    plan, hosts = two_nodes(tmp_path)
    server = start_etcd(tmp_path)
    sleepers = [subprocess.Popen(["sleep", "60"]) for cohort in (0, 1)]  # the node's two ranks, on the faulty GPU
    try:
        etcd = Etcd(server.url)
        coord = Coordination(etcd, plan.deployment, 0)
        ranks = []
        for cohort, process in enumerate(sleepers):
            assert coord.create_slot(Slot(cohort, 3, RUNNING))
            ranks.append(LocalRank(cohort=cohort, generation=3, unit=plan.unit_name("engine", cohort),
                                   pid=process.pid, pidfd=None, cgroup=None, leader=False, started=time.time(),
                                   node=hosts[0], node_rank=0))
        node = NodeMemory(ranks={r.cohort: r for r in ranks})
        notifier = Notifier(plan, hosts[0], os.open(os.devnull, os.O_WRONLY))
        executor = node_executor(plan, hosts[0], etcd, EventLog(str(tmp_path / "events.jsonl"), hosts[0], journal=None),
                                 node, 0, notifier)
        action, detail = classify(79)
        fault = GpuFault("GPU-0", "0000:3b:00", 79, action, detail, "fake", time.time())
        executor(gpu_faults([fault], node, None, hosts[0], plan.failover, Now.read()))
        (link,) = notifier.links
        sent = [link.queue.get_nowait(), link.queue.get_nowait()]
        assert [(n.cohort, n.reason) for n in sent] == [(0, "gpu-fault"), (1, "gpu-fault")]
        written = [coord.slot(cohort)[0] for cohort in (0, 1)]
        assert all(s is not None and s.state == "failed" for s in written), written
        first_write = min(s.since for s in written if s is not None)
        assert max(n.since for n in sent) <= first_write, (
            f"a notice was sent {max(n.since for n in sent) - first_write:.6f} s after the first compare-and-swap")
        assert [p.wait(timeout=5) for p in sleepers] == [-signal.SIGKILL] * 2  # killed before any etcd write too
    finally:
        for process in sleepers:
            if process.poll() is None:
                process.kill()
            process.wait()
        server.stop()
