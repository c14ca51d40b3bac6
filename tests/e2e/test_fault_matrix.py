"""The fault matrix (docs/reliability.md): the faults that kill agents or blind them, each injected into a live
3-host deployment under constant request load (testbed instance 8, 198.18.8.0/24), each checked for what must
not be lost:

(a) no failed request after the promotion (none at all where nothing should fail);
(b) the slot records as expected, and no mixed generation: every node's rank of a cohort started after that
    cohort's last failure declaration;
(c) no agent restarted unless the row restarts it;
(d) the staged model's status and digest unchanged.

Row 8 (a clock step of one node) is a unit test with an injected clock (tests/unit/test_agent_node.py); every other
row is here. Rows 6 and 7 put a proxy in front of etcd for node1 and node2 (tests/e2e/etcd_fault_proxy.py behind an
nftables redirect on node0).
Development: SHADOWLINE_MATRIX_KEEP=1 keeps the testbed and its deployment at the end and reuses a serving one;
never in CI. The deployment is the default testbed inventory (node0: leader and the one infra host) with tight settings:
``stable_after_s`` 8, ``wake_timeout_s`` 12, and the drills' detection (3 s /health, 2 s stalled generation).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shadowline.cluster import discovery
from shadowline.common.coordination import Keys, RecordInvalid, Slot
from shadowline.common.etcd_client import Etcd
from shadowline.common.frontend import send
from testbed.inventory import failover_under_load
from testbed.pytest_fixtures import skip_reason

from ..loopback import wait_until
from . import launch
from .deployed import LEADER, MODEL, NODES, UNIT, Deployed, Load
from .site_helpers import say

INSTANCE = "8"
# an engine's discovery lease of 60 s: Dynamo 1.6.1 ends an engine whose lease keep-alive failed that long, and
# row 2 stops etcd for 30 s (the default, 30 s, survives about 20 s)
LEASE_TTL_S = 60
# Detection under load (testbed/inventory.py): the testbed's own 1 s declared the serving leader hung in the middle of
# row 11 under CI's load (CI of stop 48); no row measures the detection itself.
# A shadow's wake (the lock taken, to active) takes 0.2-0.5 s on a quiet machine and 3-6 s in drills that load it
# (cut-node, gpu-xid-fatal); at 4 s, CI's load made the healthy relaunched shadow of rows 10 and 11 time out too (CI
# of stop 50), so row 10 ping-ponged between two declared wakes. Row 10's hang-wake never wakes: any bound shows it.
WAKE_TIMEOUT_S = 12.0
EXTRA_VARS = {"gms_failover": failover_under_load(wake_timeout_s=WAKE_TIMEOUT_S),
              "gms_engine": {"backend": "standin", "tensor_parallel_size": 3, "gpus_per_node": 1,
                             "lease_ttl_s": LEASE_TTL_S}}
d = Deployed(INSTANCE, EXTRA_VARS)
tb = d.tb
KEYS = Keys("demo", 0)
HOSTS = ("node0", "node1", "node2")  # the replica's nodes: the view reads their own records
AGENT_METRICS_PORT = 8480
PROXY_PORT = 23795  # beside the etcd proxy of Dynamo's processes (127.0.0.1:23790-23792)


def etcd(user: str = "agent") -> Etcd:
    return d.etcd(user)


@pytest.fixture(scope="module")
def deployment() -> Iterator[None]:
    if reason := skip_reason():
        pytest.skip(reason)
    if not (launch.REPO / ".runtime" / "bin" / "python").exists():
        pytest.fail("the runtime is missing: run `make runtime`")
    running = tb.load_journal()
    if running is not None and (running.nodes != 3 or running.slurm or tb.problems(running)):
        tb.down()
    tb.up(3, False)
    keep = os.environ.get("SHADOWLINE_MATRIX_KEEP") == "1"  # development only: reuse a deployment, keep it
    try:
        if not (keep and running is not None and d.completion_ok()):
            proc = d.playbook("site.yml", timeout=900)
            assert proc.returncode == 0, f"site.yml failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
        d.assert_whole()
        yield
    finally:
        d.close_clients()
        if not keep:
            tb.down()
            left = tb.leaks()
            assert not left, f"testbed instance {INSTANCE} left things on the machine: {left}"


@pytest.fixture
def steady(deployment: None, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A whole deployment before the row, and what must be the same after it. The row's measured outcome (its
    load, what was declared, ``figures`` it adds) is printed at its end: docs/reliability.md's table."""
    d.assert_whole()
    wait_until(lambda: all(s.slot.attempts == 0 for s in _slots().values()) or None, 30, 0.5,
               "the slots' crash-loop counters back at 0")
    before = {"agents": d.agents(), "model": d.model_status(), "t0": time.time(), "figures": {}}
    Load.last = None
    yield before
    assert d.model_status() == before["model"], "the staged model changed"
    d.assert_whole()
    load = Load.last
    reasons = sorted({f"{e['cohort']}:{e['detail'].get('reason')}" for e in declared(before["t0"])})
    say(request, f"matrix {request.node.name}: "
                 + (f"{len(load.requests)} requests, {len(load.failed())} failed; " if load else "")
                 + f"declared {reasons or 'nothing'}; " + json.dumps(before["figures"]))


def _slots() -> dict[int, Any]:
    from shadowline.control.view import read_view
    return read_view(etcd(), KEYS, frozenset({0, 1}), HOSTS).slots


def declared(since: float, cohort: int | None = None) -> list[dict[str, Any]]:
    return [e for e in d.all_events(since, "failure-declared") if cohort is None or e["cohort"] == cohort]


def wait_event(event: str, since: float, timeout: float = 60, host: str | None = None,
               cohort: int | None = None) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        events = d.events(host, since, event) if host else d.all_events(since, event)
        return next((e for e in events if cohort is None or e.get("cohort") == cohort), None)
    return wait_until(found, timeout, 0.25, f"event {event}" + (f" of cohort {cohort}" if cohort is not None else ""))


def promoted_at(since: float) -> float:
    return wait_event("promoted", since, 60, LEADER)["time"]


def same_agents(before: dict[str, Any], restarted: tuple[str, ...] = ()) -> None:
    after = d.agents()
    changed = {h: (before["agents"][h], after[h]) for h in NODES if h not in restarted and after[h] != before["agents"][h]}
    assert not changed, f"agents restarted: {changed}"


def readable(client: Etcd, key: str) -> int | None:
    """The generation in a slot record, None while it does not parse."""
    try:
        return Slot.parse(client.get(key).value).generation
    except RecordInvalid:
        return None


# --- row 1: records that do not parse ----------------------------------------------------------------------------
def test_row01_malformed_slot_records(steady: dict[str, Any]) -> None:
    t0 = steady["t0"]
    parked = 1 - d.serving()
    key = KEYS.slot(parked)
    client = etcd()
    good = Slot.parse(client.get(key).value)
    with Load(d) as load:
        client.put(key, b"{not json")  # repaired by the driver: its rank of the cohort runs
        repaired = wait_event("record-repaired", t0, 20, LEADER, parked)
        assert repaired["generation"] == good.generation
        newer = json.dumps({**json.loads(good.to_json()), "schema": 99, "lease_owner": "x"})
        client.put(key, newer)  # a newer shadowline's record: reported, left alone
        wait_until(lambda: any("newer" in e["detail"]["why"] for e in d.events("node2", t0, "record-invalid")), 20,
                   0.25, "node2 reporting the newer record")
        time.sleep(1.0)
        assert client.get(key).value.decode() == newer, "a newer shadowline's record was overwritten"
        client.put(key, json.dumps({**json.loads(good.to_json()), "generation": "two"}))  # wrong types: repaired
        wait_until(lambda: readable(client, key) == good.generation, 20, 0.25, "the repair")
        client.put(KEYS.slot(7), Slot(cohort=7, generation=1, state="failed").to_json())  # outside the plan
        wait_until(lambda: any("not in the plan" in e["detail"]["why"] for e in d.events(LEADER, t0, "record-invalid")),
                   20, 0.25, "the driver reporting cohort 7")
        client.delete(KEYS.slot(7))
        time.sleep(2)
    assert load.failed() == [], load.summary()
    assert declared(t0) == [], "a malformed record failed a generation"
    same_agents(steady)


# --- rows 2 and 14: etcd away ---------------------------------------------------------------------------------------
def test_row02a_etcd_stopped_30s_while_idle(steady: dict[str, Any]) -> None:
    """etcd stopped 30 s and started again: nothing is declared and serving goes on; then the shadow that was
    parked across the restart wakes when the serving leader is killed (its Dynamo runtime's etcd token, taken when
    it started, outlives etcd's restart: etcd hands out signed JWTs, plan_builder.ETCD_TOKEN_TTL_S; with etcd's
    default simple tokens its first write at the wake was refused and it exited)."""
    t0 = steady["t0"]
    parked = 1 - d.serving()
    parked_pid = d.main_pid(LEADER, parked)
    with Load(d) as load:
        d.on(LEADER, "systemctl", "stop", f"{UNIT}-etcd")
        try:
            time.sleep(30)
        finally:
            d.on(LEADER, "systemctl", "start", f"{UNIT}-etcd")
        wait_until(lambda: len(d.all_events(t0, "etcd-reachable")) >= 3, 30, 0.5, "every agent reaching etcd again")
        # Dynamo 1.6.1 renews its lease only every third of its TTL after it reconnects: the driver renews every
        # discovery lease at once, so that no lease runs out in etcd before its holder renews it
        refreshed = wait_event("leases-refreshed", t0, 30, LEADER)
        client = etcd()
        ttls = {lease: client.lease_ttl(int(lease, 16)) for lease in refreshed["detail"]["leases"]}
        wait_until(d.completion_ok, 60, 0.5, "serving after etcd is back")  # the frontend may have ended: restarted
        back = time.time()
        time.sleep(3)
    own = own_keepalives(client, list(ttls))
    steady["figures"].update(leases_refreshed=len(ttls), ttl_after_s=sorted(ttls.values()), own_keepalive_after_s=own)
    assert ttls and min(ttls.values()) > 45, ttls
    assert declared(t0) == [], "an etcd outage alone failed a generation"
    assert load.failed(after=back + 1) == [], load.summary()
    assert d.main_pid(LEADER, parked) == parked_pid, "the parked shadow was relaunched: nothing left to wake"
    with Load(d) as load:
        killed = d.kill_rank(LEADER, 1 - parked)
        promoted = wait_event("promoted", killed, 60, LEADER)
        time.sleep(2)
    assert promoted["cohort"] == parked, f"the shadow parked across etcd's restart did not take over: {promoted}"
    assert declared(killed, parked) == [], [e["detail"] for e in declared(killed, parked)]
    assert load.failed(after=promoted["time"]) == [], load.summary()
    wait_event("relaunch-complete", killed, 90, LEADER, 1 - parked)
    same_agents(steady)


def test_row02c_the_etcd_proxy_killed_on_every_node(steady: dict[str, Any]) -> None:
    """Each host's etcd proxy (HAProxy, the only way Dynamo's engines and frontend reach etcd) SIGKILLed on every
    node at once while serving: systemd starts it again (Restart=always, 1 s), every engine keeps its lease (an
    outage of about a second: each holder renews its lease through its new proxy), nothing is declared and no
    request fails."""
    t0 = steady["t0"]
    unit = f"{UNIT}-etcd-proxy"
    before = {host: d.on(host, "systemctl", "show", "-p", "MainPID", "--value", unit).strip() for host in NODES}
    with Load(d) as load:
        time.sleep(2)
        for host in NODES:
            d.on(host, "systemctl", "kill", "--signal=SIGKILL", unit)
        killed = time.time()

        def restarted() -> dict[str, str] | None:
            now = {host: d.on(host, "systemctl", "show", "-p", "MainPID", "--value", unit).strip() for host in NODES}
            return now if all(pid not in ("", "0", before[host]) for host, pid in now.items()) else None
        wait_until(restarted, 15, 0.25, "every etcd proxy running again")
        back = round(time.time() - killed, 2)
        client = etcd()
        leases = [format(r.lease, "x") for r in discovery.registrations(client)]
        renewed = own_keepalives(client, leases)  # every lease renewed by its holder, through its new proxy
        steady["figures"].update(proxies_back_s=back, leases=len(leases), own_keepalive_after_s=renewed)
    assert leases, "no discovery lease to follow"
    assert declared(t0) == [], "a restart of the etcd proxies failed a generation"
    assert load.failed() == [], load.summary()
    same_agents(steady)


def own_keepalives(client: Etcd, leases: list[str]) -> float:
    """Seconds until every lease was renewed by its holder (its TTL went up again): at most a third of the TTL (its
    keep-alive period) and 15 s for its reconnection (gRPC's backoff, 1 s growing 1.6 times each try; on a loaded CI
    machine once more than the 5 s allowed before, 2026-11-27), well within the TTL.

    Dynamo 1.6.1 counts an etcd outage from the holder's own last keep-alive answer and, once reconnected, renews
    only at its next keep-alive tick: a second outage before that adds to the first (measured: row 2b started 4 s
    after row 2a's 30 s outage, and the serving engine ended 11 s into it with "Unable to maintain lease ...
    deadline exceeded"; docs/reliability.md). Renewing the lease in etcd (the driver's leases-refreshed) does not
    move that client-side deadline, so the next row starts only once every holder renewed on its own."""
    start = time.time()
    last = {lease: client.lease_ttl(int(lease, 16)) for lease in leases}
    pending = set(leases)
    while pending and time.time() < start + LEASE_TTL_S / 3 + 15:
        time.sleep(0.5)
        for lease in sorted(pending):
            ttl = client.lease_ttl(int(lease, 16))
            if ttl > last[lease]:
                pending.discard(lease)
            last[lease] = ttl
    assert not pending, f"leases not renewed by their holders within a third of the TTL + 15 s: {sorted(pending)}"
    return round(time.time() - start, 1)


def test_row02b_etcd_stopped_a_worker_killed_etcd_back(steady: dict[str, Any]) -> None:
    """The death happens while etcd is away: node2 kills its rank's rest at once and declares once etcd is back
    (never restarting the one rank into the running generation), as rank-exited; its failure notice reaches the
    other nodes' agents directly, which kill their ranks of that generation without etcd."""
    t0 = steady["t0"]
    parked = 1 - d.serving()
    with Load(d) as load:
        d.on(LEADER, "systemctl", "stop", f"{UNIT}-etcd")
        try:
            time.sleep(1)
            killed = time.time()
            d.kill_rank("node2", parked)
            time.sleep(10)
        finally:
            d.on(LEADER, "systemctl", "start", f"{UNIT}-etcd")
            etcd_back = time.time()
        wait_event("relaunch-complete", t0, 90, LEADER, parked)
        wait_until(d.completion_ok, 60, 0.5, "serving after etcd is back")  # the frontend may have ended: restarted
        back = time.time()
        time.sleep(2)
    d.assert_no_mixed_generation(parked)
    assert declared(t0, parked), "the death was never declared"
    assert {e["cohort"] for e in declared(t0)} == {parked}, [(e["node"], e["cohort"], e["detail"]) for e in
                                                             declared(t0)]
    # declared with its cause, whichever node wrote it once etcd was back: node2 remembers its own declaration,
    # the others the notice (never rank-missing: every node knew why its rank was gone)
    assert [e["detail"]["reason"] for e in declared(t0)] == ["rank-exited"], declared(t0)
    assert load.failed(after=back + 1) == [], load.summary()
    for host in [n for n in NODES if n != "node2"]:
        told = [e for e in d.events(host, killed, "teardown-requested") if e["cohort"] == parked]
        gone = [e for e in d.events(host, killed, "ranks-gone") if e["cohort"] == parked]
        assert told and told[0]["detail"]["via"] == "notice" and told[0]["detail"]["by"] == "node2", (host, told)
        assert gone and gone[0]["time"] < etcd_back, f"{host}'s rank was not gone while etcd was away: {gone}"
    same_agents(steady)


def test_row03_agent_stopped_a_worker_killed_agent_started(steady: dict[str, Any]) -> None:
    t0 = steady["t0"]
    parked = 1 - d.serving()
    with Load(d) as load:
        d.on("node2", "systemctl", "stop", f"{UNIT}-agent")
        try:
            d.kill_rank("node2", parked)
            time.sleep(1)
        finally:
            d.on("node2", "systemctl", "start", f"{UNIT}-agent")
        missing = wait_event("failure-declared", t0, 30, "node2", parked)
        assert missing["detail"]["reason"] == "rank-missing"
        wait_event("relaunch-complete", t0, 90, LEADER, parked)
    d.assert_no_mixed_generation(parked)
    assert load.failed() == [], load.summary()
    same_agents(steady, restarted=("node2",))


def test_row04_etcd_unreachable_3s_right_after_kill_leader(steady: dict[str, Any]) -> None:
    t0 = steady["t0"]
    serving = d.serving()
    etcd_pid = d.on(LEADER, "systemctl", "show", "-p", "MainPID", "--value", f"{UNIT}-etcd").strip()
    with Load(d) as load:
        d.kill_rank(LEADER, serving)
        time.sleep(0.05)
        d.on(LEADER, "kill", "-STOP", etcd_pid)
        try:
            time.sleep(3)
        finally:
            d.on(LEADER, "kill", "-CONT", etcd_pid)
        after = promoted_at(t0)
        time.sleep(2)
    assert load.failed(after=after) == [], load.summary()
    d.assert_no_mixed_generation(serving)
    same_agents(steady)


def test_row05_compaction_and_defrag_then_kill_leader(steady: dict[str, Any]) -> None:
    t0 = steady["t0"]
    client = etcd("root")  # compaction and defragmentation are etcd administration
    client.compact(client.range_prefix(KEYS.root)[1])
    client.defragment()
    serving = d.serving()
    with Load(d) as load:
        d.kill_rank(LEADER, serving)
        after = promoted_at(t0)
        time.sleep(2)
    assert load.failed(after=after) == [], load.summary()
    d.assert_no_mixed_generation(serving)
    same_agents(steady)


@contextlib.contextmanager
def etcd_proxy(*mode: str) -> Iterator[None]:
    """The other hosts' etcd traffic redirected (nftables, on node0) through tests/e2e/etcd_fault_proxy.py."""
    script = launch.REPO / "tests" / "e2e" / "etcd_fault_proxy.py"
    d.on(LEADER, "systemd-run", "--unit=fault-etcd-proxy", "--collect", "/usr/bin/python3", str(script),
         "--listen", f"{d.address}:{PROXY_PORT}", "--to", f"{d.address}:2379", *mode)
    d.on(LEADER, "sh", "-c", "nft add table ip shadowline_fault && nft add chain ip shadowline_fault pre "
                             "'{ type nat hook prerouting priority dstnat; }' && nft add rule ip shadowline_fault pre "
                             f"ip saddr != {d.address} tcp dport 2379 redirect to :{PROXY_PORT}")
    try:
        yield
    finally:
        tb.exec_in(LEADER, ["nft", "delete", "table", "ip", "shadowline_fault"], timeout=30)
        tb.exec_in(LEADER, ["systemctl", "stop", "fault-etcd-proxy"], timeout=30)


def test_row06_slow_etcd_never_delays_the_local_kill(steady: dict[str, Any]) -> None:
    """etcd answers node1 and node2 1.5 s late: a dead rank's node still kills the rest of the rank at once,
    before its declaration reaches etcd, and the failover completes."""
    t0 = steady["t0"]
    parked = 1 - d.serving()
    with Load(d) as load:
        with etcd_proxy("--delay", "1.5"):
            time.sleep(2)
            killed = d.kill_rank("node2", parked)
            exited = wait_event("rank-exited", killed - 0.01, 10, "node2", parked)
            gone = wait_event("ranks-gone", killed - 0.01, 10, "node2", parked)
            mine = wait_event("failure-declared", killed - 0.01, 20, cohort=parked)
            wait_event("relaunch-complete", t0, 90, LEADER, parked)
    steady["figures"].update(local_kill_s=round(gone["time"] - exited["time"], 3),
                             declared_after_s=round(mine["time"] - exited["time"], 3))
    assert gone["time"] - exited["time"] < 0.2, (exited, gone)
    assert gone["time"] < mine["time"], "the local kill waited for etcd"
    d.assert_no_mixed_generation(parked)
    assert load.failed() == [], load.summary()
    same_agents(steady)


def test_row07_etcd_answers_cut_short(steady: dict[str, Any]) -> None:
    """One etcd answer in ten to node1 and node2 is cut in half: no agent dies, nothing is declared that did not
    fail, and a real failure (a parked worker killed meanwhile) is still carried through."""
    t0 = steady["t0"]
    parked = 1 - d.serving()
    with Load(d) as load:
        with etcd_proxy("--cut", "10"):
            time.sleep(8)
            assert declared(t0) == [], "cut answers alone failed a generation"
            d.kill_rank("node2", parked)
            wait_event("relaunch-complete", t0, 90, LEADER, parked)
    assert {e["cohort"] for e in declared(t0)} == {parked}
    d.assert_no_mixed_generation(parked)
    assert load.failed() == [], load.summary()
    same_agents(steady)


FREEZE = "/sys/fs/cgroup/freezer/shadowline-fault"


def test_row09_rank_outliving_sigkill_is_not_gone_until_its_cgroup_is_empty(steady: dict[str, Any]) -> None:
    """A process of the rank is stuck in an uninterruptible wait (a v1 freezer cgroup holds it in state D: SIGKILL
    does not end it) for 5 s after the rank died: no confirmation and no relaunch before its cgroup is empty."""
    t0 = steady["t0"]
    parked = 1 - d.serving()
    cgroup = d.on("node2", "systemctl", "show", "-p", "ControlGroup", "--value",
                  f"{UNIT}-engine@{parked}.service").strip()
    stuck = d.on("node2", "sh", "-c", f"mkdir -p {FREEZE}; sleep 300 >/dev/null 2>&1 & p=$!; "
                                      f"for h in systemd unified; do echo $p > '/sys/fs/cgroup/'$h'{cgroup}/cgroup.procs'; "
                                      f"done; echo $p > {FREEZE}/cgroup.procs; echo FROZEN > {FREEZE}/freezer.state; "
                                      "echo $p").strip()
    try:
        with Load(d) as load:
            killed = d.kill_rank("node2", parked)
            not_gone = wait_event("ranks-not-gone", killed, 10, "node2", parked)
            time.sleep(max(0.0, killed + 5 - time.time()))
            assert not [e for e in d.events("node2", killed, "ranks-gone") if e["cohort"] == parked]
            d.on("node2", "sh", "-c", f"echo THAWED > {FREEZE}/freezer.state")
            gone = wait_event("ranks-gone", killed, 20, "node2", parked)
            scheduled = wait_event("relaunch-scheduled", killed, 30, LEADER, parked)
            wait_event("relaunch-complete", t0, 90, LEADER, parked)
    finally:
        tb.exec_in("node2", ["sh", "-c", f"echo THAWED > {FREEZE}/freezer.state; kill -9 {stuck}; sleep 0.2; "
                                         f"rmdir {FREEZE}"], timeout=30)
    steady["figures"].update(gone_after_kill_s=round(gone["time"] - killed, 3))
    assert not_gone["time"] < gone["time"]
    assert gone["time"] - killed >= 5.0, "confirmed gone while the cgroup still had a process"
    assert scheduled["time"] >= gone["time"], "relaunched before the old rank was gone everywhere"
    d.assert_no_mixed_generation(parked)
    assert load.failed() == [], load.summary()
    same_agents(steady)


def test_row10_shadow_hung_while_waking_is_failed_and_the_next_takes_over(steady: dict[str, Any]) -> None:
    t0 = steady["t0"]
    serving = d.serving()
    parked = 1 - serving
    fault = f"/run/shadowline/demo/gms/fault-engine-{parked}"
    d.on(LEADER, "sh", "-c", f"echo hang-wake > {fault}")
    try:
        time.sleep(0.5)
        with Load(d) as load:
            d.kill_rank(LEADER, serving)
            timeout = wait_event("wake-timeout", t0, 30, LEADER, parked)
            assert timeout["time"] - t0 >= WAKE_TIMEOUT_S
            assert any(e["detail"]["reason"] == "wake-timeout" for e in declared(t0, parked))
            again = wait_until(lambda: next((e for e in d.events(LEADER, t0, "promoted") if e["cohort"] == serving),
                                            None), 120, 0.5, f"cohort {serving} relaunched and promoted")
            time.sleep(2)
    finally:
        d.on(LEADER, "rm", "-f", fault)
    assert load.failed(after=again["time"]) == [], load.summary()
    same_agents(steady)


def test_row11_lock_file_deleted_while_held(steady: dict[str, Any]) -> None:
    """The lock file is deleted while the serving engine holds it: the next engine to open the path would win a
    new file at once (two active engines). The driver holds the new file in the serving engine's name, moves the
    parked shadow onto it; a kill-leader afterwards promotes exactly one shadow."""
    t0 = steady["t0"]
    serving = d.serving()
    parked = 1 - serving
    with Load(d) as load:
        d.on(LEADER, "rm", "-f", "/run/shadowline/demo/gms/failover.lock")
        wait_event("lock-replaced", t0, 20, LEADER)
        wait_event("lock-bridged", t0, 20, LEADER)
        moved = wait_event("failure-declared", t0, 20, cohort=parked)
        assert moved["detail"]["reason"] == "lock-replaced"
        wait_event("relaunch-complete", t0, 90, LEADER, parked)
        assert d.lock_holder() == f"engine-{serving}"
        assert sorted(d.leader_states().values(), key=str) == ["active", "standby"]
        killed = d.kill_rank(LEADER, serving)
        wait_event("lock-bridge-released", killed, 20, LEADER)
        after = promoted_at(killed)
        time.sleep(2)
    d.assert_whole()
    assert d.lock_holder() == f"engine-{parked}"
    assert load.failed(after=after) == [], load.summary()
    # The deletion itself costs no request. A request is the deletion's only if it failed before the kill-leader:
    # one that was still in flight when the serving rank was killed is the kill's (a single group has no other
    # worker to move it to), which is what the "one 503 in about 2 of 5 CI runs" here was, and once 12 of them
    # (CI of stop 47: every one started within 0.15 s before the kill and ended 503 after it). The agents' events
    # around the first are printed for the diagnosis.
    early = [r for r in load.failed() if r.end < killed]
    if early:
        window = [(round(e["time"] - early[0].start, 3), e["node"], e["event"], e["cohort"], e["generation"],
                   e["detail"]) for e in d.all_events(t0) if abs(e["time"] - early[0].start) < 3]
        print(f"\n[row 11] {len(early)} failed before the kill-leader: {early}; events around the first:")
        for event in window:
            print(f"[row 11]   {event}")
    assert not early, ("serving failed before the kill-leader", early)
    same_agents(steady)


def agent_healthy() -> bool:
    """node0's agent answers 200 on /health (over TLS, as the controller: a client certificate of the CA)."""
    return d.agent_health(LEADER) == 200


def test_row12_idle_connections_to_the_agent_then_kill_leader(steady: dict[str, Any]) -> None:
    t0 = steady["t0"]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    idle = []
    try:
        for _unused in range(2000):
            try:
                idle.append(socket.create_connection((d.address, AGENT_METRICS_PORT), timeout=5))
            except OSError:
                break  # the backlog is full: the agent turned them away
        assert len(idle) >= 500
        serving = d.serving()
        with Load(d) as load:
            d.kill_rank(LEADER, serving)
            after = promoted_at(t0)
            time.sleep(2)
    finally:
        for sock in idle:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    wait_until(agent_healthy, 15, 0.5, "the agent's /health once the idle connections are gone")
    assert load.failed(after=after) == [], load.summary()
    d.assert_no_mixed_generation(serving)
    same_agents(steady)


def test_row13_worker_host_rebooted(steady: dict[str, Any]) -> None:
    """node2 loses power and boots again: every cohort had a rank there (each cohort spans every node), so serving
    stops until node2 is back and the cohorts are relaunched; nothing older serves after (no mixed generation)."""
    with Load(d, duration_s=180, max_requests=1800) as load:
        rebooted = time.time()
        seconds = tb.reboot("node2")
        assert seconds < 60
        wait_until(d.completion_ok, 120, 0.5, "serving again after node2's reboot")
        back = time.time()
        steady["figures"].update(reboot_s=round(seconds, 1), serving_again_s=round(back - rebooted, 1))
        time.sleep(2)
    for cohort in (0, 1):
        d.assert_no_mixed_generation(cohort)
    assert load.failed(after=back + 1) == [], load.summary()
    same_agents(steady, restarted=("node2",))


def test_row14_the_only_infra_host_stopped_and_started(steady: dict[str, Any]) -> None:
    """etcd, NATS and the frontend (the one infra host's services) stop for 5 s: agents stay up, nothing is
    killed, and serving resumes once they are back."""
    t0 = steady["t0"]
    infra = [f"{UNIT}-frontend", f"{UNIT}-nats", f"{UNIT}-etcd"]
    with Load(d) as load:
        d.on(LEADER, "systemctl", "stop", *infra)
        try:
            time.sleep(5)
        finally:
            d.on(LEADER, "systemctl", "start", *reversed(infra))
        wait_until(d.completion_ok, 60, 0.5, "serving after the infra host is back")
        back = time.time()
        steady["figures"].update(serving_again_after_restart_s=round(back - t0 - 5, 1))
        time.sleep(3)
    assert declared(t0) == [], "losing the infra host failed a generation"
    assert load.failed(after=back + 1) == [], load.summary()
    same_agents(steady)


LONG_PROMPT = "shadowline " * 600  # about 1800 tokens of the tiny model's tokenizer (its limit is 2048)


def test_row15_no_false_positives_idle_long_prompts_long_generations(steady: dict[str, Any]) -> None:
    """What must never be declared (issue #14), at the testbed's 1 s stall setting: an idle engine (only the
    driver's canaries for 6 s), long prompts (about 1800 tokens) and long generations (256 tokens) beside the
    load for 10 s. Every answer is a success and no failure is declared."""
    t0 = steady["t0"]
    time.sleep(6)
    answers = []
    with Load(d) as load:
        end = time.time() + 10
        while time.time() < end:
            for prompt, tokens in ((LONG_PROMPT, 16), ("tell a long story", 256)):
                body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                                   "max_tokens": tokens}).encode()
                answers.append(send(d.frontend, body, 30.0))
            time.sleep(0.5)
    canaries = d.events(LEADER, t0, "canary-failed")
    steady["figures"].update(long_requests=len(answers), long_ok=sum(a.ok for a in answers),
                             canary_errors=len(canaries))
    assert all(a.ok for a in answers), [(a.status, a.error) for a in answers if not a.ok][:5]
    assert declared(t0) == [], "a healthy engine was declared failed"
    assert load.failed() == [], load.summary()
    same_agents(steady)


def test_row14b_one_etcd_member_of_three_stopped_during_a_kill_leader(deployment: None, tmp_path: Any,
                                                                      request: pytest.FixtureRequest) -> None:
    """The 3-host infra layout (gms_infra: node0..2, three etcd members): one member stopped, then a kill-leader:
    agents stay up, the failover completes as usual, nothing else is declared. The member stopped is node2's,
    which no cohort's engines use (cohort c uses member c: Dynamo 1.6.1 takes one, deployment/plan_builder.py); the
    agents use all three. Last: it redeploys the testbed."""
    infra = tmp_path / "infra.yml"
    infra.write_text("gms_infra:\n  hosts:\n    node0: {}\n    node1: {}\n    node2: {}\n")
    down = d.playbook("teardown.yml")
    assert down.returncode == 0, down.stdout[-2000:]
    up = d.playbook("site.yml", "-i", str(infra), timeout=900)
    if up.returncode != 0:  # what the frontend and its etcd proxy said, for the failure's message
        journal = tb.exec_in(LEADER, ["sh", "-c", f"journalctl -u {UNIT}-frontend -u {UNIT}-etcd-proxy --no-pager "
                                                  "-o cat | grep -v ' INFO ' | tail -n 40"], timeout=30).stdout
        raise AssertionError(f"site.yml with three infra hosts failed:\n{up.stdout[-3000:]}\n"
                             f"the frontend's and the etcd proxy's journal on {LEADER}:\n{journal[-6000:]}")
    security = d.plan().security
    assert security is not None
    members = d.on("node1", "etcdctl", f"--endpoints=https://{d.address}:2379", f"--cacert={security.ca}",
                   f"--cert={security.etcd_client_cert}", f"--key={security.etcd_client_key}", "member", "list")
    assert len(members.strip().splitlines()) == 3, members
    d.assert_whole()
    before = {"agents": d.agents()}
    t0 = time.time()
    serving = d.serving()
    with Load(d) as load:
        d.on("node2", "systemctl", "stop", f"{UNIT}-etcd")
        try:
            time.sleep(2)
            d.kill_rank(LEADER, serving)
            after = promoted_at(t0)
            wait_event("relaunch-complete", t0, 90, LEADER, serving)
            time.sleep(2)
        finally:
            d.on("node2", "systemctl", "start", f"{UNIT}-etcd")
    say(request, f"matrix {request.node.name}: {len(load.requests)} requests, {len(load.failed())} failed, "
                 f"{len(load.failed(after=after))} after the promotion; declared "
                 f"{sorted({(e['cohort'], e['detail'].get('reason')) for e in declared(t0)})}")
    assert load.failed(after=after) == [], load.summary()
    assert {e["cohort"] for e in declared(t0)} == {serving}
    d.assert_no_mixed_generation(serving)
    same_agents(before)
    d.assert_whole()
