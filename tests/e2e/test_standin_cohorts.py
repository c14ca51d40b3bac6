"""A primary and a shadow cohort of the CPU stand-in on two testbed hosts, launched by hand from the cohort plan.

Every process of the plan runs as a transient systemd unit inside its host (tests/e2e/launch.py), not through the
Ansible roles; TP 2 over the two hosts (one fake GPU each), the real dynamo.frontend and dynamo.mocker, real etcd
and NATS:

    node0  etcd, NATS, dynamo.frontend, GMS server, cohort 0 rank 0 (primary leader), cohort 1 rank 0 (shadow leader)
    node1  GMS server, cohort 0 rank 1 --headless, cohort 1 rank 1 --headless

Only real outcomes are asserted: processes, the lock file inside node0, HTTP answers, /proc counters. Every wait
is bounded; a failure shows the journals of the units concerned. Run as root:
    .venv/bin/pytest -q tests/e2e/test_standin_cohorts.py
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from shadowline.common.failover_metrics import engine_failover_view
from shadowline.deployment.plan import Plan
from shadowline.standin.settings import heartbeat_path

from . import launch
from .site_helpers import http  # straight to the testbed's addresses, never through a proxy

DEPLOYMENT = "e2e-standin"
INFRA_TIMEOUT_S = 30.0
ENGINE_TIMEOUT_S = 40.0
RETRY_REQUESTS, RETRY_SECONDS = 100, 20.0  # after the kill: at most this many requests in this long
STOPPED_WATCH_S = 3.0  # how long a SIGSTOPped primary is watched for a wrong promotion (30 lock polls)


@dataclass
class Deployment:
    """The plan, and the names, files and URLs of its pieces on the testbed."""

    plan: Plan

    @property
    def leader_host(self) -> str:
        """node rank 0: infrastructure, every cohort's leader rank, the failover lock."""
        return self.plan.nodes[0].host

    @property
    def other_host(self) -> str:
        return self.plan.nodes[1].host

    @property
    def state_dir(self) -> str:
        """Heartbeats and failover counters live beside the lock (the stand-in's default)."""
        return os.path.dirname(self.plan.lock_path)

    def engine_unit(self, cohort: int) -> str:
        return launch.unit(self.plan, "engine", cohort)

    def infra_units(self) -> list[tuple[str, str]]:
        infra = self.plan.infra
        units = [(infra.etcd[0].host, launch.unit(self.plan, "etcd")),
                 (infra.nats[0].host, launch.unit(self.plan, "nats")),
                 (infra.frontend.host, launch.unit(self.plan, "frontend"))]
        return units + [(p.host, launch.unit(self.plan, "gms")) for p in self.plan.gms_servers]

    def engine_units(self) -> list[tuple[str, str]]:
        return [(r.host, self.engine_unit(c.cohort)) for c in self.plan.cohorts for r in c.ranks]

    def rank_pid(self, cohort: int, node_rank: int) -> int:
        """Main PID of a rank's unit, in its host's PID namespace."""
        return launch.unit_pid(self.plan.cohort(cohort).ranks[node_rank].host, self.engine_unit(cohort))

    def rchar(self, cohort: int, node_rank: int, pid: int) -> int:
        return launch.proc_io(self.plan.cohort(cohort).ranks[node_rank].host, pid)["rchar"]

    def heartbeat(self, cohort: int, node_rank: int) -> str | None:
        """Content (``<step> <time>``) of a rank's collective heartbeat file, read inside its host."""
        path = heartbeat_path(self.plan.cohort(cohort).engine_id, node_rank, self.plan.lock_dir)
        return launch.read_file(self.plan.cohort(cohort).ranks[node_rank].host, path)

    def journals(self, *cohorts: int) -> str:
        """The journals of every rank of these cohorts, for failure messages."""
        ranks = [(r.host, c) for c in cohorts for r in self.plan.cohort(c).ranks]
        return "\n".join(launch.journal(host, self.engine_unit(c)) for host, c in ranks)

    def lock_content(self) -> str | None:
        return launch.read_file(self.leader_host, self.plan.lock_path)

    def system_url(self, cohort: int) -> str:
        return f"http://{self.plan.cohort(cohort).ranks[0].address}:{self.plan.cohort(cohort).ports.system}"

    def health(self, cohort: int) -> dict:
        """The leader's /health document, with the HTTP status as ``http``."""
        status, text = http("GET", self.system_url(cohort) + "/health", timeout=2.0)
        try:
            return {**json.loads(text), "http": status}
        except ValueError:
            return {"http": status, "text": text[:200]}

    def failover_state(self, cohort: int) -> str | None:
        """The leader's failover state from its /metrics (init, standby, waking, active)."""
        status, text = http("GET", self.system_url(cohort) + "/metrics", timeout=2.0)
        view = engine_failover_view(text).get(str(self.plan.cohort(cohort).engine_id)) if status == 200 else None
        return view.state if view else None

    def chat(self, timeout: float = 5.0) -> tuple[int, str]:
        """A chat completion through the frontend."""
        return http("POST", self.plan.infra.frontend_url + "/v1/chat/completions", {
            "model": self.plan.model_id, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}, timeout)


# -- bringing it up ------------------------------------------------------------------------------------------- #

def answers(url: str) -> launch.Check:
    def check() -> str | None:
        status, text = http("GET", url, timeout=2.0)
        return None if status == 200 else f"{url} answered {status} {text[:200]}"
    return check


def nats_greets(address: str, port: int) -> launch.Check:
    def check() -> str | None:
        try:
            with socket.create_connection((address, port), timeout=1.0) as conn:
                conn.settimeout(1.0)
                greeting = conn.recv(4)
        except OSError as err:
            return f"{address}:{port}: {err}"
        return None if greeting == b"INFO" else f"{address}:{port} greeted with {greeting!r}"
    return check


def file_exists(host: str, path: str) -> launch.Check:
    return lambda: None if launch.read_file(host, path) is not None else f"no {path} on {host}"


def start_infra(d: Deployment) -> None:
    """etcd, NATS and a GMS server per node; the frontend once etcd and NATS answer."""
    plan, infra = d.plan, d.plan.infra
    for node in plan.nodes:
        launch.make_dirs(node.host, [plan.socket_dir, *(f"{plan.state_dir}/engines/{c.cohort}" for c in plan.cohorts)])
    launch.make_dirs(infra.frontend.host, [plan.state_dir, infra.frontend.env["HOME"]])
    (etcd,), (nats,) = infra.etcd, infra.nats
    launch.start_unit(etcd.host, launch.unit(plan, "etcd"), etcd)
    launch.start_unit(nats.host, launch.unit(plan, "nats"), nats)  # writes its config (Process.files) first
    for gms in plan.gms_servers:
        launch.start_unit(gms.host, launch.unit(plan, "gms"), gms)

    launch.wait_for("etcd", answers(infra.etcd_endpoints.split(",")[0] + "/health"), INFRA_TIMEOUT_S,
                    explain=lambda: launch.journal(etcd.host, launch.unit(plan, "etcd")))
    address, port = infra.nats_server.split(",")[0].removeprefix("nats://").rsplit(":", 1)
    launch.wait_for("NATS", nats_greets(address, int(port)), INFRA_TIMEOUT_S,
                    explain=lambda: launch.journal(nats.host, launch.unit(plan, "nats")))
    launch.start_unit(infra.frontend.host, launch.unit(plan, "frontend"), infra.frontend)
    for gms in plan.gms_servers:
        launch.wait_for(f"the GMS server on {gms.host}", file_exists(gms.host, f"{plan.gms_dir}/gms_ready"),
                        INFRA_TIMEOUT_S, explain=lambda host=gms.host: launch.journal(host, launch.unit(plan, "gms")))
    launch.wait_for("the frontend", answers(infra.frontend_url + "/v1/models"), INFRA_TIMEOUT_S,
                    explain=lambda: launch.journal(infra.frontend.host, launch.unit(plan, "frontend")))


def start_cohort(d: Deployment, cohort: int) -> None:
    """Every rank of the cohort on its host, with the HOME its engine unit would give it (units.engine_dropin)."""
    for rank in d.plan.cohort(cohort).ranks:
        launch.start_unit(rank.host, d.engine_unit(cohort), rank.process,
                          {"HOME": f"{d.plan.state_dir}/engines/{cohort}"})


def wait_serving(d: Deployment, cohort: int) -> None:
    """The cohort's leader holds the lock, its worker is registered, and a completion comes back."""
    holder = f"engine-{d.plan.cohort(cohort).engine_id}"

    def holds_lock() -> str | None:
        content = d.lock_content()
        return None if content == holder else f"the lock file says {content!r}"

    def generate_ready() -> str | None:
        health = d.health(cohort)
        return None if health.get("endpoints", {}).get("generate") == "ready" else f"/health: {health}"

    def completion() -> str | None:
        status, body = d.chat()
        return None if status == 200 else f"{status} {body[:200]}"

    for what, check in ((f"{holder} in the lock file", holds_lock), (f"cohort {cohort} serving", generate_ready),
                        ("a completion through the frontend", completion)):
        launch.wait_for(what, check, ENGINE_TIMEOUT_S, 0.1, explain=lambda: d.journals(cohort))


def wait_parked(d: Deployment, cohort: int) -> None:
    """The shadow leader is in standby (/health 200) and its pre-started worker has finished importing."""
    def parked() -> str | None:
        health = d.health(cohort)
        if health["http"] != 200 or health.get("failover_state") != "standby":
            return f"/health: {health}"
        if "is warm" not in launch.journal_text(d.leader_host, d.engine_unit(cohort)):
            return "the pre-started worker is not warm yet"
        return None

    launch.wait_for(f"cohort {cohort} parked", parked, ENGINE_TIMEOUT_S, 0.2, explain=lambda: d.journals(cohort))


def clean_engine_state(d: Deployment) -> None:
    """While no engine runs: remove the lock file, failover counters, heartbeats and fault files of a previous test."""
    script = 'cd "$1" && rm -f failover.lock failover_metrics_engine-*.json heartbeat-engine-* fault-engine-*'
    for node in d.plan.nodes:
        launch.run_in(node.host, ["sh", "-c", script, "sh", d.state_dir])


def hosts_up() -> bool:
    """False once a test took the testbed down."""
    return launch.tb.load_journal() is not None


@pytest.fixture(scope="module")
def deployment(testbed, standin_model) -> Iterator[Deployment]:
    """Two hosts with etcd, NATS, the frontend and a GMS server per node running; no engine yet."""
    state = testbed(nodes=2)
    d = Deployment(launch.standin_plan(state.hosts, DEPLOYMENT, standin_model))
    started = time.monotonic()
    try:
        start_infra(d)
        print(f"\ninfrastructure up in {time.monotonic() - started:.1f} s")
        yield d
    finally:
        if hosts_up():
            for host, name in reversed(d.infra_units() + d.engine_units()):
                launch.stop_unit(host, name)


@pytest.fixture
def cohorts(deployment) -> Iterator[Deployment]:
    """Cohort 0 (primary) holding the lock and serving, then cohort 1 (shadow) parked; both stopped afterwards."""
    d = deployment
    clean_engine_state(d)
    started = time.monotonic()
    try:
        start_cohort(d, 0)
        wait_serving(d, 0)
        serving = time.monotonic()
        start_cohort(d, 1)
        wait_parked(d, 1)
        print(f"\nprimary serving in {serving - started:.1f} s, shadow parked {time.monotonic() - serving:.1f} s later")
        yield d
    finally:
        if hosts_up():
            for host, name in d.engine_units():
                launch.stop_unit(host, name)


# -- the tests ------------------------------------------------------------------------------------------------ #

LOG_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z ")


def log_time(text: str, needle: str) -> float | None:
    """Unix time of the first stand-in log line containing ``needle`` (the line's own UTC timestamp)."""
    for line in text.splitlines():
        if needle in line and (m := LOG_TIME.match(line)):
            return datetime.fromisoformat(m.group(1) + "+00:00").timestamp()
    return None


def model_bytes(model_dir: str) -> int:
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))


def first_completion(d: Deployment, since: float, attempts: list[tuple[float, int]]) -> None:
    """Ask until one request is served: at most RETRY_REQUESTS in RETRY_SECONDS (every 0.05 s, after 40: 0.25 s).
    Records (seconds after ``since`` when the answer came, HTTP status) in ``attempts``."""
    for attempt in range(RETRY_REQUESTS):
        if time.monotonic() - since > RETRY_SECONDS:
            return
        status, _unused = d.chat(timeout=5.0)
        attempts.append((round(time.monotonic() - since, 3), status))
        if status == 200:
            return
        time.sleep(0.05 if attempt < 40 else 0.25)


def test_sigkill_of_the_primary_leader_promotes_the_shadow(cohorts: Deployment) -> None:
    d = cohorts
    node0, node1 = d.leader_host, d.other_host
    primary, shadow = d.engine_unit(0), d.engine_unit(1)
    pids = {(c, r): d.rank_pid(c, r) for c in (0, 1) for r in (0, 1)}
    assert all(pids.values()), f"engine ranks without a process: {pids}\n{d.journals(0, 1)}"
    assert launch.lock_state(node0, d.plan.lock_path) == (True, "engine-0"), d.journals(0)
    assert d.failover_state(1) == "standby", d.journals(1)
    writer_rchar = {r: d.rchar(0, r, pids[0, r]) for r in (0, 1)}  # the leader's is gone after the kill
    before = d.heartbeat(0, 1)
    time.sleep(0.6)  # more than two collective steps (0.25 s each)
    assert d.heartbeat(0, 1) != before, f"the primary's headless rank makes no progress\n{d.journals(0)}"

    # SIGKILL of the primary's leader rank on node0, while a client keeps asking the frontend.
    attempts: list[tuple[float, int]] = []
    killed_wall, killed = time.time(), time.monotonic()
    launch.send_signal(node0, pids[0, 0], signal.SIGKILL)
    client = threading.Thread(target=first_completion, args=(d, killed, attempts), daemon=True)
    client.start()

    def engine_1_holds() -> str | None:
        content = d.lock_content()
        return None if content == "engine-1" else f"the lock file says {content!r}"

    lock_seen = launch.wait_for("engine-1 in the lock file", engine_1_holds, 10.0, 0.005, explain=lambda: d.journals(1))
    client.join(RETRY_SECONDS + 10)
    served = [t for t, status in attempts if status == 200]
    assert served, f"nothing served in {len(attempts)} requests: {attempts}\n{d.journals(0, 1)}"
    assert not launch.pid_alive(node0, pids[0, 0]), launch.journal(node0, primary)
    assert not launch.unit_active(node0, primary), f"its worker outlived it?\n{launch.journal(node0, primary)}"

    # 1. The primary's headless rank on node1 is alive and hung: its heartbeat stopped, the shadow's goes on.
    before = {r: d.heartbeat(c, 1) for r, c in (("primary", 0), ("shadow", 1))}
    time.sleep(1.0)
    after = {r: d.heartbeat(c, 1) for r, c in (("primary", 0), ("shadow", 1))}
    assert launch.pid_alive(node1, pids[0, 1]) and launch.unit_active(node1, primary), launch.journal(node1, primary)
    assert after["primary"] is not None and after["primary"] == before["primary"], (
        f"the primary's headless rank should hang; heartbeat {before['primary']!r} -> {after['primary']!r}\n"
        + launch.journal(node1, primary))
    assert after["shadow"] != before["shadow"], f"the shadow's collective is stuck: {before} -> {after}"

    # 2. The shadow's leader holds the lock and is active.
    assert launch.lock_state(node0, d.plan.lock_path) == (True, "engine-1"), d.journals(1)
    assert d.failover_state(1) == "active", d.journals(1)

    # 3. The frontend served again (above) and goes on serving.
    status, body = d.chat()
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] > 0, (status, body)

    # 4. The shadow's ranks imported their shards from GMS and read a fraction of the model's size in all (Python's
    # own start-up reads); the primary's ranks (ENGINE_ID=0, the writer) read the whole model from disk between them.
    size = model_bytes(d.plan.model_dir)
    shadow_rchar = {r: d.rchar(1, r, pids[1, r]) for r in (0, 1)}
    assert sum(writer_rchar.values()) >= size, f"the primary's ranks read {writer_rchar}; model {size} bytes"
    assert max(shadow_rchar.values()) < size / 8, f"the shadow's ranks read {shadow_rchar}; model {size} bytes"

    acquired = log_time(launch.journal_text(node0, shadow), "Failover lock acquired: engine-1")
    by_log = f"{acquired - killed_wall:.3f} s" if acquired else "not logged"
    print(f"\nSIGKILL -> engine-1 in the lock file: {lock_seen:.3f} s polled through nsenter, {by_log} by its log")
    print(f"SIGKILL -> first completion served: {served[0]:.3f} s; (s after the kill, status): {attempts}")
    print(f"rchar (bytes): primary's ranks {writer_rchar}, shadow's ranks {shadow_rchar}; model {size}")


def test_sigstopped_primary_keeps_the_lock_and_nothing_is_promoted(cohorts: Deployment) -> None:
    d = cohorts
    node0, shadow = d.leader_host, d.engine_unit(1)
    leader = d.rank_pid(0, 0)
    group = [int(p) for p in launch.run_in(node0, ["pgrep", "-g", str(leader)]).stdout.split()]
    assert leader in group and len(group) >= 2, f"the primary leader's process group (it and its worker): {group}"

    def stopped() -> str | None:
        states = {pid: launch.process_state(node0, pid) for pid in group}
        return None if set(states.values()) == {"T"} else f"process states {states}"

    launch.send_signal(node0, leader, signal.SIGSTOP, group=True)  # a hung engine: the leader and its worker
    try:
        launch.wait_for("the primary's process group to stop", stopped, 5.0, 0.05)
        seen: set[tuple[str | None, str | None]] = set()
        deadline = time.monotonic() + STOPPED_WATCH_S
        while time.monotonic() < deadline:
            seen.add((d.lock_content(), d.failover_state(1)))
            time.sleep(0.2)
        assert seen == {("engine-0", "standby")}, f"(lock file, shadow's state) seen: {seen}\n{d.journals(0, 1)}"
        assert launch.lock_state(node0, d.plan.lock_path) == (True, "engine-0")
        assert stopped() is None, "the primary did not stay stopped"
        health = d.health(1)
        assert (health["http"], health.get("failover_state")) == (200, "standby"), health
        assert "Failover lock acquired" not in launch.journal_text(node0, shadow), launch.journal(node0, shadow)
    finally:
        launch.send_signal(node0, leader, signal.SIGCONT, group=True)


def test_testbed_down_takes_the_launched_processes_with_the_hosts(cohorts: Deployment) -> None:
    """Last in this file: it takes the testbed down (the fixtures' teardowns then have nothing to stop)."""
    d = cohorts
    launched = {f"{name} on {host}": launch.machine_processes(host, name)
                for host, name in d.infra_units() + d.engine_units()}
    assert all(launched.values()), f"units without processes: {[k for k, v in launched.items() if not v]}"
    leader = f"{d.engine_unit(0)} on {d.leader_host}"
    assert len(launched[leader]) >= 2, f"{leader}: the leader and its dynamo.mocker worker; got {launched[leader]}"

    seconds = launch.tb.down()
    survivors = [f"{unit}: pid {p.pid}" for unit, procs in launched.items() for p in procs if p.alive()]
    assert not survivors, f"processes that outlived `testbed down`: {survivors}"
    assert launch.tb.leaks() == []
    print(f"\ntestbed down in {seconds:.2f} s took the {sum(map(len, launched.values()))} launched processes with it")
