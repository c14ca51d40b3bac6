"""A fleet on the testbed (issue #39, docs/fleet.md): 4 hosts as 2 replicas of 2 nodes, one frontend over both,
and a spare node (issue #40, docs/fleet.md Spare nodes): a GMS server and an agent, no rank.

site.yml converges it from nothing and a second run changes nothing; model.yml verifies the spare's copy of the
model with the nodes'; each replica's agents drive their own
replica (its records under ``replicas/<q>/`` in etcd, its own lock holder); both replicas' serving workers are
registered under the one model name. drill.yml on one replica (kill-leader, kill-worker, hang-leader,
stall-generation): 0 failed first attempts, streaming or not, the replica's parked shadow promoted inside it, the
other replica untouched. failover.yml and upgrade.yml refuse a fleet without a replica before anything changes;
upgrade.yml -e replica=1 under load upgrades that replica alone with no failed request. Instance 6, after the
drills of the same stream (scripts/test-suite).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shadowline.cluster.discovery import registrations
from shadowline.common.coordination import Keys, Slot
from shadowline.common.policy import CANARY_UNANSWERED, GENERATION_STALLED, LEADER_HUNG
from testbed.inventory import failover_under_load
from testbed.pytest_fixtures import skip_reason

from ..loopback import wait_until
from .deployed import DEPLOYMENT, MODEL, Deployed, Load
from .launch import REPO
from .site_helpers import instance_lock

INSTANCE = "6"
REPLICAS = {0: ("node0", "node1"), 1: ("node2", "node3")}
SPARE = "node4"
UNIT = f"shadowline-{DEPLOYMENT}"
# Detection under load (testbed/inventory.py): the testbed's own 1 s declared replica 1's healthy leaders hung right
# after a converge from nothing (4 hosts' engines, GMS servers and the frontend on this machine's 2 cores).
EXTRA_VARS: dict[str, Any] = {"gms_failover": failover_under_load()}
d = Deployed(INSTANCE, EXTRA_VARS)
tb = d.tb


def recap(output: str) -> dict[str, int]:
    """changed= of every host in a playbook's recap."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", output, re.M)}


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict[str, Any]]:
    if reason := skip_reason():
        pytest.skip(reason)
    if not (REPO / ".runtime" / "bin" / "python").exists():
        pytest.fail("the runtime is missing: run `make runtime`")
    with instance_lock(INSTANCE):
        if tb.load_journal() is not None:
            tb.down()
        tb.up(5, False, replicas=2, spares=1)
        try:
            started = time.monotonic()
            proc = d.playbook("site.yml", timeout=900)
            assert proc.returncode == 0, f"site.yml on the fleet failed:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"
            yield {"first": proc, "first_s": time.monotonic() - started}
        finally:
            d.close_clients()
            tb.down()
            left = tb.leaks()
            assert not left, f"testbed instance {INSTANCE} left things on the machine: {left}"


def records(replica: int) -> dict[str, Any]:
    """A replica's slots ({cohort: (generation, state)}) and active record, from etcd."""
    keys, etcd = Keys(DEPLOYMENT, replica), d.etcd()
    slots = {}
    for kv in etcd.get_prefix(keys.slots()):
        slot = Slot.parse(kv.value)
        slots[slot.cohort] = (slot.generation, slot.state)
    active = etcd.get(keys.active())
    return {"slots": slots, "active": json.loads(active.value) if active else None}


def lock_holder(host: str) -> str:
    """The failover lock's content on a replica's leader node, if a process holds it."""
    plan = d.plan()
    held = tb.exec_in(host, ["flock", "--nonblock", "--shared", plan.lock_path, "true"], timeout=10).returncode != 0
    return d.on(host, "cat", plan.lock_path).strip() if held else ""


def served_by_another(replica: int, cohort: int) -> dict[str, Any] | None:
    """The replica's records once a cohort other than ``cohort`` is its active one."""
    now = records(replica)
    return now if now["active"] and now["active"]["cohort"] != cohort else None


def whole(replica: int) -> bool:
    """The replica serves (its leader node holds the lock) and every slot of it runs."""
    now = records(replica)
    return bool(lock_holder(REPLICAS[replica][0])) and len(now["slots"]) == 2 and \
        all(state == "running" for _generation, state in now["slots"].values())


def test_site_converges_a_fleet_and_a_second_run_changes_nothing(fleet: dict[str, Any]) -> None:
    status = fleet["first"].stdout
    for q in REPLICAS:
        assert re.search(rf"replica {q}: lock holder engine-[01]; [0-4] of 4 ranks healthy", status), \
            status[-3000:]
    if any(f"replica {q}: lock holder engine-0; 4 of 4 ranks healthy" not in status for q in REPLICAS):
        # the agents already failed a generation over (CI of stop 50, replica 0 right after its converge, on 2 cores
        # shared with the other stream's converges): not this test's subject, and the replica must come back whole
        print("\nfleet: a failover during the first converge; the agents said:\n"
              + d.story(time.time() - fleet["first_s"] - 30))
    for q in REPLICAS:
        wait_until(lambda q=q: whole(q) or None, 120, 0.5, f"replica {q} whole after the converge")
    second = d.playbook("site.yml", timeout=600)
    assert second.returncode == 0, second.stdout[-3000:]
    changed = recap(second.stdout)
    assert set(changed) == {"node0", "node1", "node2", "node3", SPARE} and not any(changed.values()), \
        f"a second site.yml run changed something: {changed}\n{second.stdout[-3000:]}"
    print(f"\nfleet: site.yml from nothing {fleet['first_s']:.0f} s (4 nodes, 2 replicas, 1 spare)")


def test_the_spare_runs_a_gms_server_and_an_agent_and_no_rank(fleet: dict[str, Any]) -> None:
    assert f"spare {SPARE}: GMS server active, agent active" in fleet["first"].stdout, fleet["first"].stdout[-3000:]
    plan = d.plan()
    assert [s.host for s in plan.spares] == [SPARE]
    for unit in (plan.unit_name("gms"), plan.unit_name("agent")):
        assert d.on(SPARE, "systemctl", "is-active", unit).strip() == "active", unit
    engines = d.on(SPARE, "systemctl", "list-units", "--all", "--plain", "--no-legend", f"{UNIT}-engine@*")
    assert engines.strip() == "", f"a spare runs no rank: {engines}"
    presence = d.etcd().get(Keys(DEPLOYMENT, None).agent(SPARE))
    assert presence is not None and json.loads(presence.value)["role"] == "spare"
    ready = 'shadowline_agent_spare_ready{deployment="demo",node="node4"}'

    def spare_ready(value: str) -> bool | None:
        answer = d.agent_get(SPARE, "/metrics")
        return True if answer and answer[0] == 200 and f"{ready} {value}" in answer[1] else None
    assert wait_until(lambda: spare_ready("1.0"), 30, 1.0, "the spare's agent says it is ready"), \
        d.agent_get(SPARE, "/metrics")
    # its GMS server stopped: the spare is not ready (what ShadowlineSparesBelowMinimum counts), and ready again
    # once it runs again
    d.on(SPARE, "systemctl", "stop", plan.unit_name("gms"))
    try:
        assert wait_until(lambda: spare_ready("0.0"), 15, 0.5, "the spare's agent says it is not ready")
    finally:
        d.on(SPARE, "systemctl", "start", plan.unit_name("gms"))
    assert wait_until(lambda: spare_ready("1.0"), 30, 0.5, "the spare ready again")


def test_model_playbook_verifies_the_spares_copy_with_the_nodes(fleet: dict[str, Any]) -> None:
    """playbooks/model.yml covers the spare node too (a spare that takes a node's place loads the same weights):
    site.yml staged it there, so model.yml re-verifies every node's and the spare's copy, changes nothing, and
    its table has a row for the spare."""
    proc = d.playbook("model.yml", timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert recap(proc.stdout) == {host: 0 for host in (*REPLICAS[0], *REPLICAS[1], SPARE)}, proc.stdout[-4000:]
    rows = [line for line in proc.stdout.splitlines() if re.search(rf"\b{SPARE}\b.*\bReady\b", line)]
    assert rows, f"model.yml's table has no Ready row for the spare {SPARE}:\n{proc.stdout[-4000:]}"
    assert "all 5 node(s) Ready with digest" in proc.stdout, proc.stdout[-4000:]


def test_each_replica_keeps_its_own_records_lock_and_serving_worker(fleet: dict[str, Any]) -> None:
    for replica, (leader, _second) in REPLICAS.items():
        assert wait_until(lambda q=replica: whole(q) or None, 60, 0.5, f"replica {replica} whole")
        now = records(replica)
        assert set(now["slots"]) == {0, 1} and now["active"] is not None, now
        assert lock_holder(leader) == f"engine-{now['active']['cohort']}"
    etcd = d.etcd()
    keys = [kv.key for kv in etcd.get_prefix(f"/shadowline/{DEPLOYMENT}/")]
    assert not [k for k in keys if re.match(rf"/shadowline/{DEPLOYMENT}/(slots|gone|ranks|active)", k)], keys
    workers = {r.host for r in registrations(etcd) if "generate" in r.endpoints and r.model_name == MODEL}
    plan = d.plan()
    assert workers == {plan.node("node0").address, plan.node("node2").address}, workers


@pytest.mark.parametrize(("replica", "fault"), [(1, "kill-leader"), (0, "kill-worker"), (1, "hang-leader"),
                                                (0, "stall-generation")])
def test_a_drill_on_one_replica_fails_no_request(fleet: dict[str, Any], tmp_path: Any, replica: int,
                                                  fault: str) -> None:
    """drill.yml -e replica=q: the fault lands on that replica (its leader node, its second node), its agents
    detect it, tear its cohort down, promote its parked shadow and relaunch; the drill's load (the OpenAI SDK,
    every other request streaming) counts each request's first attempt: 0 failed, streaming or not, while the
    other replica serves and its records do not change."""
    other = 1 - replica
    for q in REPLICAS:
        wait_until(lambda q=q: whole(q) or None, 90, 0.5, f"replica {q} whole before the drill")
    untouched = records(other)
    path = tmp_path / f"{fault}.json"
    # a request on a frozen replica waits for the detection (3 s of /health silence here) and the teardown before
    # it moves: more than the drill's default 5 s request timeout under CI's load (CI, 2026-11-29: hang-leader), where
    # the fleet's promise is a request that is served, however late (the SDK's own default is 600 s); the added
    # latency is measured and printed
    proc = d.playbook("drill.yml", "-e", f"fault={fault}", "-e", f"replica={replica}", "-e", f"drill_report={path}",
                      "-e", "drill_warmup_s=1", "-e", "drill_tail_s=1", "-e", "drill_request_timeout_s=20",
                      timeout=300)
    assert proc.returncode == 0 and "result: PASS" in proc.stdout, f"drill {fault} failed:\n{proc.stdout[-4000:]}"
    report = json.loads(path.read_text())
    requests = report["requests"]
    assert requests["sent"] >= 50 and requests["failed_raw"] == 0, requests
    assert requests["client"] == "openai" and requests["streams"] >= requests["sent"] // 2 - 1, requests
    assert {g["cohort"] for g in report["failed_generations"]}, "the drill failed no generation"
    assert records(other) == untouched, "the other replica's records changed"
    assert report["orphans"] == []
    # which replica served: Dynamo names each answer's worker, discovery names its node; both replicas served
    # from the fault on (the frontend's round robin), and every answer named a worker of the deployment
    served = report["served_by"]["from_fault"]
    assert served.get("0") and served.get("1") and "unknown" not in served, report["served_by"]
    # the added latency needs requests that ended before the fault (the drill's 1 s warm-up here, of which the SDK's
    # own start-up may take all): computed whenever there are
    latency = report["latency_s"]
    assert latency["fault_n"] >= 20 and (latency["baseline_n"] == 0 or latency["added_p99"] is not None), latency
    print(f"\n[figure] fleet {fault} on replica {replica}: {requests['sent']} requests "
          f"({requests['streams']} streaming), failed_raw {requests['failed_raw']}, failed_sdk "
          f"{requests['failed_sdk']}; promote {report['promote_s']} s; served from the fault by replica 0/1: "
          f"{served.get('0')}/{served.get('1')}; added latency p50 {latency['added_p50']} s, "
          f"p99 {latency['added_p99']} s")


def test_failover_of_one_replicas_cohort_and_the_refusals_that_change_nothing(fleet: dict[str, Any]) -> None:
    """failover.yml -e replica=0 -e cohort=<its serving cohort>: that replica's shadow takes over and the cohort is
    relaunched, the other replica untouched. Without a replica failover.yml and upgrade.yml refuse a fleet, each
    before anything changes."""
    for q in REPLICAS:
        wait_until(lambda q=q: whole(q) or None, 90, 0.5, f"replica {q} whole")
    before = {q: records(q) for q in REPLICAS}
    serving = before[0]["active"]["cohort"]
    for playbook, extra, words in (
            ("failover.yml", ("-e", f"cohort={serving}"), "replica: the deployment is a fleet of 2 replicas"),
            ("upgrade.yml", (), "replica: the deployment is a fleet of 2 replicas and upgrade.yml takes one")):
        proc = d.playbook(playbook, *extra, timeout=300)
        assert proc.returncode != 0 and words in proc.stdout, proc.stdout[-2000:]
    assert {q: records(q) for q in REPLICAS} == before
    proc = d.playbook("failover.yml", "-e", "replica=0", "-e", f"cohort={serving}", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    after = wait_until(lambda: served_by_another(0, serving), 60, 0.5, "replica 0's shadow serving")
    assert after["slots"][serving][0] > before[0]["slots"][serving][0], after  # the cohort relaunched
    assert records(1) == before[1], "replica 1's records changed"
    wait_until(lambda: whole(0) or None, 90, 0.5, "replica 0 whole after its failover")


def running_argv(host: str, cohort: int) -> list[str]:
    return d.on(host, "cat", f"/proc/{d.main_pid(host, cohort)}/cmdline").rstrip("\0").split("\0")


def test_an_upgrade_of_one_replica_under_load_leaves_the_other_as_it_was(fleet: dict[str, Any]) -> None:
    """upgrade.yml -e replica=1 (a fleet is upgraded one replica at a time): replica 1's shadows first, then its
    serving cohort hands over; every rank of replica 1 runs the new arguments, every rank of replica 0 the old ones
    with its records unchanged, and an application using the OpenAI SDK (half its requests streaming) saw no
    failure, not even a first attempt."""
    for q in REPLICAS:
        wait_until(lambda q=q: whole(q) or None, 90, 0.5, f"replica {q} whole")
    before = records(0)
    engine = {"backend": "standin", "tensor_parallel_size": 2, "gpus_per_node": 1,
              "extra_args": ["--max-model-len", "2048"]}
    started = time.time()
    with Load(d, rate=10.0, duration_s=300, max_requests=3000, client="openai") as load:
        time.sleep(1)
        proc = d.playbook("upgrade.yml", "-e", json.dumps({"gms_engine": engine}), "-e", "replica=1", timeout=420)
        time.sleep(2)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for host in REPLICAS[1]:
        assert f"{host}: every cohort on the new configuration" in proc.stdout, proc.stdout[-3000:]
        for cohort in (0, 1):
            assert running_argv(host, cohort)[-2:] == ["--max-model-len", "2048"], (host, cohort)
    for host in REPLICAS[0]:
        for cohort in (0, 1):
            assert "--max-model-len" not in running_argv(host, cohort), (host, cohort)
    # the spare follows the new plan (upgrade.yml's last play), its agent on it
    plan = d.plan()
    plan_file = f"{plan.config_dir}/plan.json"
    spare_plan = d.on(SPARE, "cat", plan_file)
    assert spare_plan == d.on(REPLICAS[1][0], "cat", plan_file) and "2048" in spare_plan, \
        f"the spare {SPARE} kept the old plan after the upgrade:\n{proc.stdout[-3000:]}"
    assert d.on(SPARE, "systemctl", "is-active", plan.unit_name("agent")).strip() == "active"
    after = records(0)
    if after != before:
        # A hang declared by replica 0's own agents under CI's load (CI of stop 50: replica 0 failed over in the
        # middle of replica 1's upgrade) is not the upgrade's doing: an upgrade that touched replica 0's ranks
        # would show as a rank that exited, or as their new arguments (checked above). Anything else fails.
        declared = [e for host in REPLICAS[0] for e in d.events(host, started, "failure-declared")]
        hangs = {LEADER_HUNG, GENERATION_STALLED, CANARY_UNANSWERED}
        story = d.story(started)
        assert declared and all(e["detail"].get("reason") in hangs for e in declared), \
            f"replica 0's records changed during replica 1's upgrade: {before} -> {after}\n{story}"
        print(f"\nfleet: replica 0's agents declared a hang during replica 1's upgrade (load):\n{story}")
    failed = [r for r in load.requests if r.first_ok is False or not r.ok]
    print(f"\n[figure] fleet upgrade of replica 1: {len(load.requests)} requests "
          f"({sum(r.stream for r in load.requests)} streaming), {len(failed)} failed first attempts")
    assert load.requests and not failed, load.summary()


def test_teardown_removes_every_unit_and_process_of_the_fleet_and_its_spare(fleet: dict[str, Any]) -> None:
    """teardown.yml (last: the fleet is gone after it) on 4 nodes and a spare: no unit of the deployment is left
    loaded and no process of it runs on any of the 5 hosts (teardown.yml's own check, then the test's)."""
    started = time.monotonic()
    proc = d.playbook("teardown.yml", timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for host in (*REPLICAS[0], *REPLICAS[1], SPARE):
        units = d.on(host, "systemctl", "list-units", "--all", "--plain", "--no-legend", f"{UNIT}-*")
        assert units.strip() == "", f"{host} kept units after teardown.yml: {units}"
        processes = tb.exec_in(host, ["pgrep", "-af", f"shadowline.*{DEPLOYMENT}|gpu_memory_service|standin"],
                               timeout=10)
        assert processes.returncode == 1, f"{host} runs processes of the deployment: {processes.stdout}"
    print(f"\nfleet: teardown.yml of 4 nodes and a spare {time.monotonic() - started:.1f} s")
