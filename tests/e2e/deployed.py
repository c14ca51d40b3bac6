"""A site.yml deployment on one testbed instance, as the end-to-end tests look at it: commands inside the hosts,
the agents' event logs, the failover lock, the leaders' failover states, completions through the frontend, the
engine units' processes and start times. Bound to one instance (``Deployed("8")``); nothing here changes the
deployment except ``playbook``.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadowline.cluster.access import agent_url, client_context, controller_etcd
from shadowline.cluster.discovery import registrations
from shadowline.common.etcd_client import Etcd
from shadowline.common.failover_metrics import engine_failover_view
from shadowline.common.http import http_get
from shadowline.deployment.plan import Plan
from shadowline.drill.load import Request, run_load

from ..loopback import wait_until
from . import launch

DEPLOYMENT = "demo"  # inventories/testbed/group_vars
UNIT = f"shadowline-{DEPLOYMENT}"
EVENTS = f"/var/lib/shadowline/{DEPLOYMENT}/events.jsonl"
LOCK = f"/run/shadowline/{DEPLOYMENT}/gms/failover.lock"
LEADER = "node0"
NODES = ("node0", "node1", "node2")
MODEL = "shadowline/tiny-llama"


@dataclass(frozen=True)
class UnitRun:
    """An engine unit's main process on a host: its pid and when it started (machine's monotonic seconds)."""
    pid: int
    started_mono: float


class Deployed:
    def __init__(self, instance: str, extra_vars: dict[str, Any]) -> None:
        self.instance = instance
        self.tb = launch.load_testbed(instance)
        self.extra_vars = extra_vars
        self.address = f"198.18.{instance}.10"
        self.frontend = f"http://{self.address}:8000"
        # every etcd client etcd() handed out, by identity and testbed (its hosts' pids): close_clients
        self.clients: dict[tuple[str, tuple[int, ...]], Etcd] = {}

    # --- commands ---------------------------------------------------------------------------------------------
    def playbook(self, name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "ANSIBLE_CONFIG": str(launch.REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
               "SHADOWLINE_TESTBED": self.instance}
        return subprocess.run([str(launch.REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(self.tb.INVENTORY),
                               f"playbooks/{name}", "-e", json.dumps(self.extra_vars), *args],
                              cwd=launch.REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)

    def on(self, host: str, *argv: str, timeout: float = 30) -> str:
        proc = self.tb.exec_in(host, list(argv), timeout=timeout)
        assert proc.returncode == 0, f"{host}: {' '.join(argv)}: {proc.stderr.strip()}"
        return proc.stdout

    def plan(self) -> Plan:
        """The plan the deployment runs (plan.json on the leader node)."""
        return Plan.from_dict(json.loads(self.on(LEADER, "cat", f"/etc/shadowline/{DEPLOYMENT}/plan.json")))

    def agent_health(self, host: str) -> int | None:
        """The status of ``host``'s agent /health (None: no answer)."""
        answer = self.agent_get(host, "/health")
        return answer[0] if answer else None

    def agent_get(self, host: str, path: str) -> tuple[int, str] | None:
        """(status, text) of ``host``'s agent endpoint ``path`` (None: no answer), over TLS as the controller (its
        client certificate of the deployment's CA) unless the plan is insecure; a node's or a spare's."""
        plan = self.plan()
        context = None
        if plan.secure and plan.security is not None:
            pki = Path(plan.security.controller_path) / "pki"
            context = client_context(str(pki / "ca.crt"), str(pki / "controller" / "client.crt"),
                                     str(pki / "controller" / "client.key"))
        return http_get(f"{agent_url(plan, host)}{path}", 5, context)

    def etcd(self, user: str = "agent") -> Etcd:
        """The deployment's etcd as one of its identities (the controller's copy of the password). Patient: a
        fresh client's first call is a TLS handshake and an authentication (bcrypt) before the read itself, which
        took more than the agents' 2 s under CI's load (CI, 2026-11-29: the drills' slots_running and status.yml
        both saw 'no etcd endpoint answered' while every agent, on its kept connection, ran on).
        One client per identity and testbed (its hosts' pids), kept: a poll of etcd every half second that made a
        new one each time authenticated (bcrypt, about 70 ms of etcd's CPU on a quiet machine) every time."""
        journal = self.tb.load_journal()
        key = (user, tuple(host.pid for host in journal.hosts) if journal is not None else ())
        client = self.clients.get(key)
        if client is None:
            client = self.clients[key] = controller_etcd(self.plan(), timeout=5.0, deadline=10.0, user=user)
        return client

    def close_clients(self) -> None:
        """Close the kept-alive connections of every etcd client handed out: a failed test's traceback keeps its
        clients, and so their connections to the testbed, alive to the end of the session, and the leak check
        after the testbed is down would count them (CI, 2026-11-27: a row's failure made the next module's
        teardown fail too)."""
        for client in self.clients.values():
            client.close()
        self.clients.clear()

    # --- what the agents say -----------------------------------------------------------------------------------
    def story(self, since: float, quiet: tuple[str, ...] = ("leases-refreshed", "gpu-watch-started")) -> str:
        """Every node's agent events since ``since``, one line each in time order: what a failed assertion on
        requests needs beside them (a CI failure is read from its output alone)."""
        lines = []
        for host in NODES:
            lines += [e for e in self.events(host, since) if e["event"] not in quiet]
        return "\n".join(f"{e['time']:.2f} {e['node']} {e['event']} cohort {e.get('cohort')} generation "
                         f"{e.get('generation')} {json.dumps(e.get('detail'))[:160]}"
                         for e in sorted(lines, key=lambda e: e["time"]))

    def events(self, host: str = LEADER, since: float = 0.0, event: str | None = None) -> list[dict[str, Any]]:
        proc = self.tb.exec_in(host, ["cat", EVENTS], timeout=30)
        out = []
        for line in proc.stdout.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record["time"] >= since and (event is None or record["event"] == event):
                out.append(record)
        return out

    def all_events(self, since: float = 0.0, event: str | None = None) -> list[dict[str, Any]]:
        found = [e for host in NODES for e in self.events(host, since, event)]
        return sorted(found, key=lambda e: e["time"])

    def agents(self) -> dict[str, tuple[int, int]]:
        """Each node's agent: (main pid, systemd's restart count)."""
        out = {}
        for host in NODES:
            props = dict(line.split("=", 1) for line in self.on(
                host, "systemctl", "show", "-p", "MainPID", "-p", "NRestarts", f"{UNIT}-agent").split())
            out[host] = (int(props["MainPID"]), int(props["NRestarts"]))
        return out

    # --- the lock, the leaders, serving --------------------------------------------------------------------------
    def lock_holder(self) -> str:
        """The lock file's content, and that some process really holds it (flock probe inside node0)."""
        held = self.tb.exec_in(LEADER, ["flock", "--nonblock", "--shared", LOCK, "true"], timeout=10).returncode != 0
        return self.on(LEADER, "cat", LOCK).strip() if held else ""

    def serving(self) -> int:
        return int(self.lock_holder().rsplit("-", 1)[1])

    def leader_states(self) -> dict[int, str | None]:
        """Each cohort leader's failover state from its own /metrics (system ports 8080, 8081 on node0)."""
        states: dict[int, str | None] = {}
        for cohort in (0, 1):
            try:
                with urllib.request.urlopen(f"http://{self.address}:{8080 + cohort}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                states[cohort] = None
                continue
            view = engine_failover_view(text).get(str(cohort))
            states[cohort] = view.state if view else None
        return states

    def completion_ok(self) -> bool:
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "e2e test"}],
                           "max_tokens": 4}).encode()
        request = urllib.request.Request(f"{self.frontend}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def assert_whole(self, timeout: float = 60) -> None:
        """Exactly one lock holder, which is the one active leader; the other parked; the frontend serves."""
        def whole() -> dict | None:
            s = self.leader_states()
            return s if s and sorted(s.values(), key=str) == ["active", "standby"] else None
        states = wait_until(whole, timeout, 0.2, "one leader active and one parked")
        active = next(c for c, s in states.items() if s == "active")
        assert self.lock_holder() == f"engine-{active}"
        assert wait_until(self.completion_ok, 15, 0.2, "a completion through the frontend")

    def assert_one_registration(self, timeout: float = 10) -> None:
        """Discovery holds one worker, the serving one, within ``timeout`` (a third of the engines' 30 s lease): a
        failed generation's registration left there keeps the frontend routing requests to a dead worker until its
        lease runs out, and a request that meets three of them fails (testbed, 2026-11-27: left whenever the
        failed cohort was relaunched before its successor registered)."""
        etcd = self.etcd()
        workers: list[str] = []
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                workers = [f"{r.instance_id} at {r.request_address}" for r in registrations(etcd)
                           if "generate" in r.endpoints]
                if len(workers) == 1:
                    return
                time.sleep(0.2)
        finally:
            etcd.close()  # its kept-alive connection would outlive the testbed (the module's leak check)
        raise AssertionError(f"discovery holds {len(workers)} workers after {timeout} s, not the serving one only: "
                             f"{workers}")

    # --- engine units ---------------------------------------------------------------------------------------------
    def engine(self, host: str, cohort: int) -> UnitRun | None:
        """The engine unit's main process, None when the unit does not run."""
        props = dict(line.split("=", 1) for line in self.on(
            host, "systemctl", "show", "-p", "MainPID", "-p", "ExecMainStartTimestampMonotonic",
            f"{UNIT}-engine@{cohort}").split())
        pid = int(props.get("MainPID") or 0)
        return UnitRun(pid, int(props["ExecMainStartTimestampMonotonic"]) / 1e6) if pid else None

    def main_pid(self, host: str, cohort: int, timeout: float = 60) -> int:
        run = wait_until(lambda: self.engine(host, cohort), timeout, 0.2, f"engine@{cohort} running on {host}")
        return run.pid

    def kill_rank(self, host: str, cohort: int) -> float:
        """SIGKILL the rank's main process; returns when (machine's wall clock, just before the kill)."""
        pid = self.main_pid(host, cohort)
        when = time.time()
        self.on(host, "kill", "-KILL", str(pid))
        return when

    def assert_no_mixed_generation(self, cohort: int, timeout: float = 90) -> None:
        """Every node's rank of ``cohort`` started after that cohort's last failure declaration (on any node),
        once its slot runs again: no rank of an older generation serves beside a new one."""
        declared = [e["time"] for e in self.all_events(event="failure-declared") if e["cohort"] == cohort]
        assert declared, f"no failure of cohort {cohort} was declared"
        last = max(declared)
        offset = time.time() - time.monotonic()  # the hosts share the machine's clocks
        runs = wait_until(lambda: (r := {h: self.engine(h, cohort) for h in NODES}) and all(r.values()) and r,
                          timeout, 0.5, f"cohort {cohort} running on every node")
        older = {h: round(r.started_mono + offset - last, 3) for h, r in runs.items()
                 if r.started_mono + offset < last}
        assert not older, f"cohort {cohort}: ranks started before its last failure declaration (s): {older}"

    def model_status(self) -> dict[str, tuple[str, str]]:
        """Each node's staged model: (state, digest) from its status file."""
        out = {}
        for host in NODES:
            text = self.on(host, "sh", "-c", "cat /var/lib/shadowline/models/*/.shadowline-model-*.status.json")
            record = json.loads(text)
            out[host] = (record["state"], record["digest"])
        return out


class Load:
    """Constant request load through the frontend (the drills' open-loop generator, drill/load.py) in a
    thread, for the length of a ``with`` block (bounded: at most ``max_requests``, at most ``duration_s``)."""

    last: Load | None = None  # the latest load started (the fault matrix reports it per row)

    def __init__(self, deployed: Deployed, rate: float = 10.0, duration_s: float = 120.0,
                 max_requests: int = 1200, client: str = "raw") -> None:
        Load.last = self
        self.args = (deployed.frontend, MODEL, rate, duration_s, max_requests)
        self.client = client  # raw: one attempt per request; openai: the SDK with its retries, half streaming
        self.stop = threading.Event()
        self.requests: list[Request] = []
        self.thread = threading.Thread(target=self.run, name="load", daemon=True)

    def run(self) -> None:
        url, model, rate, duration_s, max_requests = self.args
        self.requests = run_load(url, model, rate=rate, duration_s=duration_s, max_requests=max_requests,
                                 timeout_s=5.0, stop=self.stop, client=self.client)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)

    def failed(self, after: float = 0.0) -> list[Request]:
        """Requests sent at or after ``after`` (wall clock) that failed."""
        return [r for r in self.requests if not r.ok and r.start >= after]

    def summary(self) -> str:
        bad = [r for r in self.requests if not r.ok]
        return f"{len(self.requests)} sent, {len(bad)} failed: " + "; ".join(
            f"{r.start:.2f} {r.status} {r.error}" for r in bad[:8])
