"""A fleet on the testbed (issue #39, docs/fleet.md): 4 hosts as 2 replicas of 2 nodes, one frontend over both.

site.yml converges it from nothing and a second run changes nothing; each replica's agents drive their own
replica (its records under ``replicas/<q>/`` in etcd, its own lock holder); both replicas' serving workers are
registered under the one model name. A kill of a replica's serving leader, and of a serving rank on a replica's
second node, under load from a client without retries: 0 failed requests, the replica's parked shadow promoted
inside it, the other replica untouched. The playbooks that act on one replica refuse a fleet before anything
changes. Instance 6, after the drills of the same stream (scripts/test-suite).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shadowline.cluster.discovery import registrations
from shadowline.common.coordination import Keys, Slot
from shadowline.drill.load import Request, run_load
from testbed.pytest_fixtures import skip_reason

from ..loopback import wait_until
from .deployed import DEPLOYMENT, MODEL, UNIT, Deployed
from .launch import REPO
from .site_helpers import instance_lock

INSTANCE = "6"
REPLICAS = {0: ("node0", "node1"), 1: ("node2", "node3")}
EXTRA_VARS: dict[str, Any] = {}
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
        tb.up(4, False, replicas=2)
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


def whole(replica: int) -> bool:
    """The replica serves (its leader node holds the lock) and every slot of it runs."""
    now = records(replica)
    return bool(lock_holder(REPLICAS[replica][0])) and len(now["slots"]) == 2 and \
        all(state == "running" for _generation, state in now["slots"].values())


def promoted(replica: int, killed: int) -> dict[str, Any] | None:
    """The replica's records once a cohort other than ``killed`` is the active one."""
    now = records(replica)
    return now if now["active"] and now["active"]["cohort"] != killed else None


def under_load(fault: Any, seconds: float = 20.0) -> list[Request]:
    """``fault()`` 5 s into ``seconds`` of 20 requests per second from a raw client (one attempt each, 5 s)."""
    out: dict[str, list[Request]] = {}
    load = threading.Thread(target=lambda: out.setdefault("requests", run_load(
        d.frontend, MODEL, rate=20, duration_s=seconds, max_requests=int(seconds * 20), timeout_s=5.0)))
    load.start()
    time.sleep(5)
    fault()
    load.join(timeout=seconds + 30)
    return out["requests"]


def test_site_converges_a_fleet_and_a_second_run_changes_nothing(fleet: dict[str, Any]) -> None:
    status = fleet["first"].stdout
    assert "replica 0: lock holder engine-0; 4 of 4 ranks healthy" in status, status[-3000:]
    assert "replica 1: lock holder engine-0; 4 of 4 ranks healthy" in status, status[-3000:]
    second = d.playbook("site.yml", timeout=600)
    assert second.returncode == 0, second.stdout[-3000:]
    changed = recap(second.stdout)
    assert set(changed) == {"node0", "node1", "node2", "node3"} and not any(changed.values()), \
        f"a second site.yml run changed something: {changed}\n{second.stdout[-3000:]}"
    print(f"\nfleet: site.yml from nothing {fleet['first_s']:.0f} s (4 hosts, 2 replicas)")


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


@pytest.mark.parametrize(("replica", "host", "which"), [(1, "node2", "leader"), (0, "node1", "second node")])
def test_a_replicas_serving_rank_killed_under_load_fails_no_request(fleet: dict[str, Any], replica: int, host: str,
                                                                    which: str) -> None:
    """The serving cohort's rank on the replica's leader node, or on its second node, SIGKILLed: the replica's
    shadow takes over inside it while the other replica serves, and a client without retries sees no failure."""
    other = 1 - replica
    for q in REPLICAS:
        wait_until(lambda q=q: whole(q) or None, 90, 0.5, f"replica {q} whole before the kill")
    before, untouched = records(replica), records(other)
    serving = before["active"]["cohort"]
    t0 = time.time()
    requests = under_load(lambda: d.on(host, "systemctl", "kill", "--kill-whom=main", "-s", "KILL",
                                       f"{UNIT}-engine@{serving}.service"))
    failed = [r for r in requests if not r.ok]
    story = d.story(t0) if failed else ""
    assert len(requests) >= 300 and not failed, f"{len(failed)} of {len(requests)} failed: {failed[:5]}\n{story}"
    after = wait_until(lambda: promoted(replica, serving), 60, 0.5, f"replica {replica}'s shadow promoted")
    assert after["active"]["cohort"] == 1 - serving
    wait_until(lambda: whole(replica) or None, 90, 0.5, f"replica {replica} whole again (its killed cohort parked)")
    assert records(other) == untouched, "the other replica's records changed"
    print(f"\nfleet: replica {replica}'s serving rank on its {which} ({host}) killed: {len(requests)} requests, "
          f"0 failed; cohort {1 - serving} promoted inside replica {replica}")


def test_the_playbooks_of_one_replica_refuse_a_fleet_and_change_nothing(fleet: dict[str, Any]) -> None:
    before = {q: records(q) for q in REPLICAS}
    for playbook, extra in (("failover.yml", ("-e", "cohort=0")), ("drill.yml", ("-e", "fault=kill-leader"))):
        proc = d.playbook(playbook, *extra, timeout=300)
        assert proc.returncode != 0, proc.stdout[-2000:]
        assert f"the deployment is a fleet of 2 replicas and {playbook} does not take a replica yet" in proc.stdout, \
            proc.stdout[-2000:]
    assert {q: records(q) for q in REPLICAS} == before
