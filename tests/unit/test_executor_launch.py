"""A relaunch or a promotion does not hold up the agent's loop (control/node_effects.py ``launch``,
``check_start``, control/driver_effects.py ``look_at_promotion``): systemd is asked for the start job in a thread,
the loop tracks the start only once it was asked, each look at the start's unit runs in a thread too, and so does each look at a promoted cohort. ``systemctl`` here is a script first on PATH
that takes 0.3 s (on a loaded testbed host the two calls took 31-180 ms, during which the driver's promotion was
not recorded) and logs each call with its start and end."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from shadowline.common.etcd_client import EtcdError
from shadowline.common.events import EventLog
from shadowline.control.actions import AbandonStart, CheckStart, Launch, LookAtPromotion
from shadowline.control.agent_metrics import AgentMetrics
from shadowline.control.executor import Executor, Schedule
from shadowline.control.memory import DriverMemory, NodeMemory, Promotion, PromotionSeen
from shadowline.control.node_duties import NodeDuties
from shadowline.control.observe import HealthAnswer, LeaderProbe, StartCheck, UnitState, look_at_promotion
from shadowline.deployment.contract import parse_contract
from shadowline.deployment.plan import Plan
from shadowline.deployment.plan_builder import build_plan

from .helpers import hostvars
from .test_agent_node import memory, rank
from .test_executor_order import node_executor, two_nodes

SLOW_SYSTEMCTL = '''#!{python}
"""systemctl for the test: takes 0.3 s, then appends its arguments and when it ran to {log}."""
import json, sys, time
start = time.time()
time.sleep(0.3)
with open({log!r}, "a") as out:
    out.write(json.dumps({{"argv": sys.argv[1:], "start": start, "end": time.time()}}) + "\\n")
'''


def fake_systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str = SLOW_SYSTEMCTL) -> Path:
    """``script`` (formatted with ``python`` and ``log``) as systemctl, first on PATH; the log of its calls."""
    calls = tmp_path / "systemctl.log"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text(script.format(python=sys.executable, log=str(calls)))
    (bindir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return calls


def slow_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Plan, Path, NodeMemory, Executor]:
    """A node agent's executor (no driver) on the first of two hosts, the slow systemctl first on PATH."""
    plan, hosts = two_nodes(tmp_path)
    calls = fake_systemctl(tmp_path, monkeypatch)
    node = NodeMemory()
    executor = node_executor(plan, hosts[0], None, EventLog(str(tmp_path / "events.jsonl"), hosts[0], journal=None),
                             node, 1)
    return plan, calls, node, executor


def test_a_launch_returns_at_once_and_its_start_is_tracked_once_asked(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch):
    plan, calls, node, executor = slow_node(tmp_path, monkeypatch)
    unit = plan.unit_name("engine", 1)

    executor([Launch(1, 4)])
    returned = time.time()
    start = node.starting[1]
    assert start.generation == 4 and not start.asked(), "tracked before systemd was asked for the start job"
    assert start.requested is not None and start.requested.wait(5)
    assert start.asked()
    ran = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [c["argv"] for c in ran] == [["reset-failed", unit], ["start", "--no-block", unit]]
    assert returned < ran[0]["end"], "the loop waited for systemctl"

    # a start abandoned while its job is being asked for: the stop comes after the start, never before it
    calls.unlink()
    executor([Launch(1, 5)])
    executor([AbandonStart(1, 5, 6, "launching")])
    assert 1 not in node.starting
    ran = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [c["argv"][0] for c in ran] == ["reset-failed", "start", "stop"]
    assert ran[2]["start"] >= ran[1]["end"], "systemctl stop ran before the start job was asked for"


def test_a_look_at_a_start_returns_at_once_and_its_answer_comes_back(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch):
    _plan, calls, node, executor = slow_node(tmp_path, monkeypatch)
    executor([CheckStart(1, 4)])
    returned = time.time()
    assert node.checking == {1: 4} and executor.take_start_checks() == []
    deadline = time.monotonic() + 5
    answers: list[StartCheck] = []
    while not answers and time.monotonic() < deadline:
        answers = executor.take_start_checks()
        time.sleep(0.02)
    # this systemctl answers nothing: no rank runs, the unit's state unknown (judged as "still starting")
    assert answers == [StartCheck(1, 4, None, UnitState("unknown", "?", "?"))]
    ran = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [c["argv"][0] for c in ran] == ["show", "show"]
    assert returned < ran[0]["end"], "the loop waited for systemctl show"


def promoting_driver(plan: Plan, host: str, events: Path) -> tuple[DriverMemory, Executor]:
    """The driver's memory while cohort 0 (generation 3) is promoted, and its executor on ``host``."""
    driver = DriverMemory(promotion=Promotion(0, 3, "engine-1", time.time(), time.monotonic() + 30,
                                              time.monotonic() + 10))
    return driver, Executor(plan, host, None, EventLog(str(events), host, journal=None),
                            AgentMetrics(plan.deployment, host, [0, 1], driver=True), NodeMemory(), driver, Schedule(),
                            os.open(os.devnull, os.O_WRONLY))


def test_a_look_at_a_promotion_returns_at_once_and_its_answer_is_handed_to_the_promotion(tmp_path: Path):
    """The look reads the promoted leader's metrics (here its system port accepts and never answers: no state
    seen, after the read's 0.5 s) in a thread; the loop gets the answer through take_probe_results, which says a
    promotion answer came (the loop then verifies at once)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    hv, hosts = hostvars(2, gms_insecure=True, gms_ports={"system_base": silent.getsockname()[1]})
    hv[hosts[0]]["ansible_host"] = "127.0.0.1"
    contract, problems = parse_contract(hv, hosts)
    assert contract is not None, problems
    plan = build_plan(contract, state_dir=str(tmp_path / "state"), config_dir=str(tmp_path / "config"))
    driver, executor = promoting_driver(plan, hosts[0], tmp_path / "events.jsonl")
    began = time.monotonic()
    executor([LookAtPromotion()])
    p = driver.promotion
    assert p is not None and p.looking and p.look_sent >= began
    assert executor.probes.promotion_looks.empty(), "the loop waited for the look"
    deadline = time.monotonic() + 5
    while not executor.take_probe_results():
        assert time.monotonic() < deadline, "the look never answered"
        time.sleep(0.02)
    assert not p.looking and p.seen is not None and p.seen.state is None and p.seen.leases == ()
    assert p.seen == PromotionSeen(state=None, state_at=p.seen.state_at)
    # an answer about a promotion that ended meanwhile is dropped
    executor([LookAtPromotion()])
    driver.promotion = None
    deadline = time.monotonic() + 5
    while executor.probes.promotion_looks.empty() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert executor.take_probe_results() is False
    silent.close()


def test_a_promotion_looks_error_is_reported_at_most_every_ten_seconds(tmp_path: Path):
    """A look at the promotion that answered an error (every 50 ms while it lasts) writes one line per error, not
    one per look; the promotion takes the answer and is looked at again."""
    plan, hosts = two_nodes(tmp_path)
    log = tmp_path / "events.jsonl"
    driver, executor = promoting_driver(plan, hosts[0], log)
    for look in range(3):
        driver.promotion.looking = True
        executor.probes.promotion_looks.put((0, 3, PromotionSeen(error="KeyError: 'kvs'")))
        assert executor.take_probe_results() is True, f"look {look}"
        assert not driver.promotion.looking, f"look {look}"
    errors = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["event"], e["detail"]["error"]) for e in errors] == [("promotion-look-error", "KeyError: 'kvs'")]


def test_a_look_at_a_promotion_always_answers(tmp_path: Path):
    """A look whose read raised something unexpected still answers (else the promotion would stay ``looking``
    and never be looked at again), with the error said; a registration etcd could not give is only not seen."""
    plan, _hosts = two_nodes(tmp_path)

    def broken(_cohort: int, _ports: set[int]) -> list[int]:
        raise KeyError("kvs")

    def away(_cohort: int, _ports: set[int]) -> list[int]:
        raise EtcdError("no etcd endpoint answered")

    assert look_at_promotion(plan, 1, False, None, broken) == PromotionSeen(error="KeyError: 'kvs'")
    assert look_at_promotion(plan, 1, False, None, away) == PromotionSeen()


def test_a_probe_that_failed_is_reported_rate_limited_and_the_tick_goes_on(tmp_path: Path):
    """A leader's probe that died of an unexpected error does not raise out of judge_probes (that ended the tick
    before its teardowns, reconcile and drive, and the loop slept a tick): the other probes are judged, the error
    is one ``leader-probe-failed`` line, the same error again within ERROR_REPORT_S is not written again, a
    different one is, and the rank can be probed again."""
    plan, hosts = two_nodes(tmp_path)
    node = memory(rank(0, 3), rank(1, 4))
    log = tmp_path / "events.jsonl"
    executor = node_executor(plan, hosts[0], None, EventLog(str(log), hosts[0], journal=None), node, 1)
    duties = NodeDuties(plan, hosts[0], node, executor)
    node.probing.update({0: 3, 1: 4})
    broken = LeaderProbe(0, 3, None, False, False, "KeyError: 'vllm:num_requests_running'")
    healthy = LeaderProbe(1, 4, HealthAnswer(ok=True, at=time.monotonic()), False, False)
    assert duties.judge_probes([broken, healthy]) is True  # no raise; cohort 1's first 200 judged beside it
    assert node.ranks[1].healthy_at is not None and node.probing == {}  # both may be probed again
    duties.judge_probes([broken])
    duties.judge_probes([LeaderProbe(0, 3, None, False, False, "TypeError: other")])
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    failed = [(e["cohort"], e["generation"], e["detail"]["error"]) for e in lines if e["event"] == "leader-probe-failed"]
    assert failed == [(0, 3, "KeyError: 'vllm:num_requests_running'"), (0, 3, "TypeError: other")]


def test_a_leaders_first_200_is_reported_once_so_the_driver_acts_at_once(tmp_path: Path):
    """judge_probes says when a leader answered its first 200 since it is tracked (the driver then marks a launch
    running without waiting for its next check period); a later 200, or a failed answer, says nothing."""
    plan, hosts = two_nodes(tmp_path)
    node = memory(rank(1, 4))
    executor = node_executor(plan, hosts[0], None, EventLog(str(tmp_path / "events.jsonl"), hosts[0], journal=None),
                             node, 1)
    duties = NodeDuties(plan, hosts[0], node, executor)
    answered = [LeaderProbe(1, 4, HealthAnswer(ok=False, at=time.monotonic()), False, False)]
    assert duties.judge_probes(answered) is False and node.ranks[1].healthy_at is None
    answered = [LeaderProbe(1, 4, HealthAnswer(ok=True, at=time.monotonic()), False, False)]
    assert duties.judge_probes(answered) is True and node.ranks[1].healthy_at is not None
    answered = [LeaderProbe(1, 4, HealthAnswer(ok=True, at=time.monotonic()), False, False)]
    assert duties.judge_probes(answered) is False
