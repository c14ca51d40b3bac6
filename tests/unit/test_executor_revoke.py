"""The driver's revocation of a failed generation's discovery registration (control/driver_effects.py ``revoke``),
against a real etcd on loopback holding Dynamo 1.6.1's records (cluster/discovery.py): the failed generation's
lease goes, and a later generation of the same cohort, registered by the time a deferred revocation is due,
keeps its own. A real dynamo.vllm leader's card names the cohort's system port, so the cohort's records of both
generations match the port lookup; revoking the later one would end the worker that serves."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shadowline.cluster.discovery import registrations
from shadowline.common.coordination import LAUNCHING, RUNNING, Slot
from shadowline.common.etcd_client import Etcd
from shadowline.common.events import EventLog
from shadowline.control.actions import RevokeRegistration
from shadowline.control.agent_metrics import AgentMetrics
from shadowline.control.driver_duties import REVOKE_RETRY_S, revoke_due
from shadowline.control.executor import Executor, Schedule
from shadowline.control.memory import DriverMemory, NodeMemory
from shadowline.control.view import DeploymentView, Now, SlotEntry
from shadowline.deployment.plan import Plan
from tests.loopback import ETCD, start_etcd

from .test_executor_order import two_nodes


def register(etcd: Etcd, plan: Plan, cohort: int, request_port: int) -> int:
    """A worker's records as dynamo.vllm writes them for the cohort's leader, on a lease of their own."""
    lease = etcd.lease_grant(30)
    c = plan.cohort(cohort)
    address, system = c.leader.address, c.ports.system
    base = f"dynamo/backend/generate/{lease:x}"
    etcd.put(f"v1/instances/{base}", json.dumps({
        "type": "Endpoint", "namespace": "dynamo", "component": "backend", "endpoint": "generate",
        "instance_id": lease, "transport": {"tcp": f"{address}:{request_port}/{lease:x}/dynamo/backend/generate"}}),
        lease=lease)
    etcd.put(f"v1/mdc/{base}", json.dumps({"namespace": "dynamo", "component": "backend", "card_json": {
        "display_name": plan.model_id, "source_path": "/models/x",
        "tokenizer": f"http://{address}:{system}/v1/metadata/tokenizer.json"}}), lease=lease)
    return lease


def test_a_failed_generation_is_revoked_and_a_later_one_of_its_cohort_kept(tmp_path: Path):
    if not os.path.exists(ETCD):
        pytest.skip("no etcd binary")
    plan, hosts = two_nodes(tmp_path)
    server = start_etcd(tmp_path)
    etcd = Etcd(server.url)
    try:
        dead = register(etcd, plan, 0, 31001)
        serving = register(etcd, plan, 0, 31002)
        driver = DriverMemory(registered={(0, 1): [dead], (0, 2): [serving]}, unrevoked={(0, 1): 1.0})
        executor = Executor(plan, hosts[0], etcd, EventLog(str(tmp_path / "events.jsonl"), hosts[0], journal=None),
                            AgentMetrics(plan.deployment, hosts[0], [0]), NodeMemory(), driver, Schedule(),
                            os.open(os.devnull, os.O_WRONLY))
        executor([RevokeRegistration(0, 1)])
        assert [r.lease for r in registrations(etcd)] == [serving], "the later generation's registration went too"
        assert (0, 1) in driver.revoked and not driver.unrevoked
        assert driver.registered == {(0, 2): [serving]}
        logged = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert [(e["event"], e["detail"]["leases"]) for e in logged] == [("registration-revoked", [f"{dead:x}"])]
    finally:
        etcd.close()
        server.stop()


def test_a_revocation_etcd_did_not_answer_is_tried_again(tmp_path: Path):
    """etcd away at the revocation (a network blip): the failed generation stays to be revoked, tried again after
    REVOKE_RETRY_S once etcd answers, instead of being taken as done (its registration would stay for its lease's
    30 s, the frontend routing requests to a dead worker)."""
    if not os.path.exists(ETCD):
        pytest.skip("no etcd binary")
    plan, hosts = two_nodes(tmp_path)
    server = start_etcd(tmp_path)
    etcd = Etcd(server.url)
    away = Etcd("http://127.0.0.1:9", timeout=0.2, deadline=0.4)  # nothing listens on the discard port
    try:
        dead = register(etcd, plan, 1, 31003)
        driver = DriverMemory(serving=0, registered={(1, 1): [dead]})
        events = tmp_path / "events.jsonl"
        executor = Executor(plan, hosts[0], away, EventLog(str(events), hosts[0], journal=None),
                            AgentMetrics(plan.deployment, hosts[0], [1]), NodeMemory(), driver, Schedule(),
                            os.open(os.devnull, os.O_WRONLY))
        relaunched = DeploymentView(slots={0: SlotEntry(Slot(0, 1, RUNNING), 10),
                                           1: SlotEntry(Slot(1, 2, LAUNCHING), 11)},
                                    agents=frozenset(hosts), gone={}, gms_lost={}, active=None)
        executor([RevokeRegistration(1, 1)])
        assert (1, 1) not in driver.revoked and (1, 1) in driver.unrevoked, "a failed revocation was taken as done"
        assert [json.loads(line)["event"] for line in events.read_text().splitlines()] == ["revoke-error"]
        failed_at = driver.revoke_failed_at[(1, 1)]
        soon = Now(wall=failed_at + REVOKE_RETRY_S / 2, mono=0.0)
        assert revoke_due(relaunched, driver, NodeMemory(), soon) == []  # not again at once
        executor.driver_side.etcd = etcd  # etcd answers again (to the driver side, which revokes)
        later = Now(wall=failed_at + REVOKE_RETRY_S, mono=0.0)
        executor(revoke_due(relaunched, driver, NodeMemory(), later))
        assert registrations(etcd) == [], "the dead registration is still there"
        assert (1, 1) in driver.revoked and not driver.unrevoked and not driver.revoke_failed_at
    finally:
        etcd.close()
        away.close()
        server.stop()
