"""Monitoring end to end: site.yml, then playbooks/monitoring.yml, on a 2-host testbed (instance 7, 198.18.7.0/24,
inventory ``.testbed-7/inventory``: deployment ``demo``, the CPU stand-in, a primary and a shadow).

1. monitoring.yml starts shadowline-demo-prometheus.service on node0 (the first infra host): a real Prometheus
   (Debian's package) scrapes every target of the targets files the role wrote, each ``up == 1``, read through
   Prometheus's HTTP API with bounded waits; the alert rules are loaded; a second run changes nothing;
2. the serving leader is killed (``kill -9`` of engine@0's main pid on node0) and Prometheus sees
   ``dynamo_component_engine_failover_state{state="active"}`` move to the other cohort, and the agents' counters
   move: detections, teardowns, promotions (and the teardown histogram's buckets), the active cohort, and the
   parked shadows back to one once cohort 0 is relaunched; the journal of an agent holds the failure's
   declaration with its fields (``journalctl -u shadowline-demo-agent SHADOWLINE_EVENT=failure-declared``).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any, Callable, Iterator

import pytest

from testbed.instances import load_testbed
from testbed.pytest_fixtures import skip_reason

from .site_helpers import (
    NO_PROXY,
    PlaybookRun,
    ansible_adhoc,
    instance_lock,
    run_playbook,
    say,
)

INSTANCE = "7"
DEPLOYMENT = "demo"
HOSTS = ["node0", "node1"]
ENGINE = f"shadowline-{DEPLOYMENT}-engine@{{}}.service"
AGENT = f"shadowline-{DEPLOYMENT}-agent"
PROMETHEUS_UNIT = f"shadowline-{DEPLOYMENT}-prometheus.service"
TARGETS_DIR = f"/etc/prometheus/shadowline-{DEPLOYMENT}/targets"
JOBS = ["shadowline-engine", "shadowline-agent", "shadowline-frontend", "shadowline-etcd", "shadowline-nats"]

tb = load_testbed(INSTANCE)
INVENTORY = tb.INVENTORY.parent

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def testbed(site_runtime: Any) -> Iterator[Any]:
    if reason := skip_reason():
        pytest.skip(reason)
    with instance_lock(INSTANCE):
        tb.down()
        state = tb.up(len(HOSTS), False)
        try:
            yield state
        finally:
            tb.down()
            left = tb.leaks()
            assert not left, f"testbed instance {INSTANCE} left things on the machine: {left}"


def host_sh(host: str, script: str, timeout: float = 60) -> str:
    proc = tb.exec_in(host, ["sh", "-c", script], timeout=timeout)
    assert proc.returncode == 0, f"{host}: `{script}` exited {proc.returncode}: {proc.stderr.strip()}"
    return proc.stdout


def playbook(name: str, log: str) -> PlaybookRun:
    run = run_playbook(name, inventory=INVENTORY, log_name=f"monitoring-{log}")
    assert run.returncode == 0, f"{name} failed ({run.log}):\n{run.output[-4000:]}"
    return run


def api(url: str, path: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with NO_PROXY.open(f"{url}/api/v1/{path}{query}", timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


def wait_for(what: str, check: Callable[[], Any], timeout: float) -> Any:
    """check() until it returns something true, at most ``timeout`` seconds; the last value is in the failure."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as err:  # Prometheus restarting, a refused connection
            last = err
        if last and not isinstance(last, OSError):
            return last
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout:.0f} s; last seen: {last}")


class Monitored:
    def __init__(self) -> None:
        self.url = ""
        self.steps: dict[str, bool] = {}


@pytest.fixture(scope="module")
def monitored(testbed: Any) -> Monitored:
    return Monitored()


def test_prometheus_scrapes_every_target_of_the_rendered_files(monitored: Monitored, request: pytest.FixtureRequest):
    started = time.monotonic()
    playbook("site.yml", "site")
    site_s = time.monotonic() - started
    first = playbook("monitoring.yml", "first")
    plan = next(iter(ansible_adhoc("gms_nodes[0]", "shadowline.gms.cohort_plan", inventory=INVENTORY).values()))
    settings = plan["plan"]["monitoring"]
    assert (settings["mode"], settings["host"]) == ("server", "node0")
    monitored.url = f"http://{settings['address']}:{settings['port']}"
    assert host_sh("node0", f"systemctl is-active {PROMETHEUS_UNIT}").strip() == "active"

    expected: set[tuple[str, str]] = set()
    for job in JOBS:
        groups = json.loads(host_sh("node0", f"cat {TARGETS_DIR}/{job}.json"))
        expected |= {(job, target) for group in groups for target in group["targets"]}
    assert len([t for j, t in expected if j == "shadowline-engine"]) == 2  # a primary and a shadow
    assert len([t for j, t in expected if j == "shadowline-agent"]) == len(HOSTS)

    def all_up() -> dict[tuple[str, str], str] | None:
        active = api(monitored.url, "targets", state="active")["activeTargets"]
        seen = {(t["labels"]["job"], t["discoveredLabels"]["__address__"]): t["health"] for t in active
                if t["labels"]["job"] in JOBS}
        return seen if set(seen) == expected and set(seen.values()) == {"up"} else None

    wait_for("every target of the targets files up", all_up, 120)
    up = api(monitored.url, "query", query='up{job=~"shadowline-.*"}')["result"]
    assert len(up) == len(expected) and all(r["value"][1] == "1" for r in up), up
    probe = api(monitored.url, "query", query='probe_success{job="shadowline-nats"}')["result"]
    assert [r["value"][1] for r in probe] == ["1"], probe
    groups = {g["name"] for g in api(monitored.url, "rules")["groups"]}
    assert groups == {"shadowline-failover", "shadowline-agent", "shadowline-model", "shadowline-infra"}

    second = playbook("monitoring.yml", "second")
    assert all(r["changed"] == 0 for r in second.recap.values()), second.changed_tasks()
    say(request, f"monitoring: site.yml {site_s:.0f} s, monitoring.yml first {first.seconds:.0f} s, "
                 f"second {second.seconds:.0f} s (changed=0); {len(expected)} targets up")
    monitored.steps["up"] = True


def active_cohorts(url: str) -> list[str]:
    result = api(url, "query", query='dynamo_component_engine_failover_state{state="active"} == 1')["result"]
    return sorted(r["metric"]["cohort"] for r in result)


def test_a_killed_leader_moves_the_active_state_to_the_other_cohort(
        monitored: Monitored, request: pytest.FixtureRequest):
    if not monitored.steps.get("up"):
        pytest.fail("needs the first test of this file, which did not pass")
    wait_for("cohort 0 active", lambda: active_cohorts(monitored.url) == ["0"], 60)
    pid = int(host_sh("node0", f"systemctl show -p MainPID --value {ENGINE.format(0)}").strip() or 0)
    assert pid > 0
    before = {name: agent_sum(monitored.url, name) for name in AGENT_COUNTERS}
    killed_at = time.time()
    host_sh("node0", f"kill -9 {pid}")
    killed = time.monotonic()
    wait_for("cohort 1 active (and only it)", lambda: active_cohorts(monitored.url) == ["1"], 90)
    switch_s = time.monotonic() - killed
    for name in AGENT_COUNTERS:
        wait_for(f"{name} increased (from {before[name]})", lambda n=name: agent_sum(monitored.url, n) > before[n],
                 60)
    buckets = api(monitored.url, "query", query=f'shadowline_agent_teardown_seconds_bucket{{deployment="{DEPLOYMENT}"}}')
    assert {r["metric"]["le"] for r in buckets["result"]} >= {"0.01", "1.0", "60.0", "+Inf"}, buckets
    wait_for("every agent sees cohort 1 active", lambda: agent_values(monitored.url, "active_cohort") == {1.0}, 60)
    wait_for("cohort 0 relaunched: a shadow parked again on every agent's view",
             lambda: agent_values(monitored.url, "parked_shadows") == {1.0}, 180)
    parked_s = time.monotonic() - killed

    def declared() -> list[dict[str, str]]:
        found = []
        for host in HOSTS:
            out = host_sh(host, f"journalctl -u {AGENT} SHADOWLINE_EVENT=failure-declared -o json --no-pager "
                                f"--since=@{int(killed_at) - 1}")
            found += [json.loads(line) for line in out.splitlines() if line.strip()]
        return [e for e in found if e.get("SHADOWLINE_COHORT") == "0"]

    entries = wait_for("the kill's declaration in an agent's journal", declared, 30)
    entry = entries[0]
    assert entry["SHADOWLINE_DEPLOYMENT"] == DEPLOYMENT and entry["SHADOWLINE_NODE"] in HOSTS, entry
    assert entry["SHADOWLINE_GENERATION"].isdigit() and entry["PRIORITY"] == "4", entry
    assert "failure-declared" in entry["MESSAGE"] and entry["_SYSTEMD_UNIT"] == f"{AGENT}.service", entry
    say(request, f"monitoring: Prometheus saw cohort 1 active {switch_s:.1f} s after the kill, the agents' "
                 f"counters move, a shadow parked again after {parked_s:.0f} s; the journal of "
                 f"{entry['SHADOWLINE_NODE']} has the declaration")


AGENT_COUNTERS = ["detections_total", "teardowns_total", "promotions_total", "teardown_seconds_count"]


def agent_sum(url: str, name: str) -> float:
    """The sum over the deployment's agents of ``shadowline_agent_<name>``, through Prometheus."""
    result = api(url, "query", query=f'sum(shadowline_agent_{name}{{deployment="{DEPLOYMENT}"}})')["result"]
    return float(result[0]["value"][1]) if result else 0.0


def agent_values(url: str, name: str) -> set[float]:
    """The values of the gauge ``shadowline_agent_<name>`` of every agent, when every agent exports it."""
    result = api(url, "query", query=f'shadowline_agent_{name}{{deployment="{DEPLOYMENT}"}}')["result"]
    values = {r["metric"]["node"]: float(r["value"][1]) for r in result}
    return set(values.values()) if set(values) == set(HOSTS) else set()
