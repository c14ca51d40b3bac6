"""The executor's dispatch (control/executor.py): every kind of action the agent's decisions return
(control/actions.py) has exactly one handler, in the node's table (Executor.NODE_ACTIONS) or the driver's
(Executor.DRIVER_ACTIONS), never both and never neither (their handlers live in control/node_effects.py and
control/driver_effects.py), so that a new action without a handler fails here rather
than in a running agent. The list of actions is read from actions.py itself: every class it defines is an action
(it defines no base or abstract class; ``Action`` is a Union of the classes, not a class, and not the list: it
lacks NoteMixed and PublishRank, which the duties return). An action of a kind in neither table is refused, named."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import get_args

import pytest

from shadowline.common.etcd_client import Etcd
from shadowline.common.events import EventLog
from shadowline.control import actions
from shadowline.control.actions import NoteMixed, Record, WakeAt
from shadowline.control.agent_metrics import AgentMetrics
from shadowline.control.executor import Executor, Schedule
from shadowline.control.memory import DriverMemory, NodeMemory

from .test_executor_order import two_nodes


def action_classes() -> list[type]:
    """The classes actions.py defines itself (not those it imports: Slot, LocalRank, Promotion, ...), by name."""
    return sorted((cls for _, cls in inspect.getmembers(actions, inspect.isclass)
                   if cls.__module__ == actions.__name__), key=lambda cls: cls.__name__)


def test_the_introspection_finds_every_action_of_the_action_union():
    defined = set(action_classes())
    assert len(defined) >= 54  # 54 when this test was written
    assert set(get_args(actions.Action)) <= defined


@pytest.mark.parametrize("kind", action_classes(), ids=lambda cls: cls.__name__)
def test_every_action_has_exactly_one_handler(kind: type):
    tables = [name for name, table in (("NODE_ACTIONS", Executor.NODE_ACTIONS),
                                       ("DRIVER_ACTIONS", Executor.DRIVER_ACTIONS)) if kind in table]
    assert len(tables) == 1, f"{kind.__name__} is handled in {tables or 'neither table'} of Executor"


def test_the_tables_handle_actions_only():
    assert set(Executor.NODE_ACTIONS) | set(Executor.DRIVER_ACTIONS) <= set(action_classes())


def executor(tmp_path: Path, driver: DriverMemory | None) -> Executor:
    """An executor as the agent builds it; its etcd is never asked here."""
    plan, hosts = two_nodes(tmp_path)
    return Executor(plan, hosts[0], Etcd("http://127.0.0.1:1"),
                    EventLog(str(tmp_path / "events.jsonl"), hosts[0], journal=None),
                    AgentMetrics(plan.deployment, hosts[0], [0]), NodeMemory(), driver, Schedule(),
                    os.open(os.devnull, os.O_WRONLY))


class Unknown:
    """No action of actions.py."""


def test_an_action_of_neither_table_is_refused_by_name(tmp_path: Path):
    for driver in (None, DriverMemory()):
        with pytest.raises(TypeError, match="Unknown is not in Executor.DRIVER_ACTIONS, nor in Executor.NODE_ACTIONS"):
            executor(tmp_path, driver).perform(Unknown())  # type: ignore[arg-type]


def test_a_drivers_action_on_a_node_that_is_no_driver_is_refused(tmp_path: Path):
    with pytest.raises(AssertionError, match="NoteMixed is a driver's action; this agent is no driver"):
        executor(tmp_path, None).perform(NoteMixed(0, 1))


def test_node_and_driver_actions_reach_their_handlers(tmp_path: Path):
    driver = DriverMemory()
    ex = executor(tmp_path, driver)
    ex([WakeAt(5.0), WakeAt(7.0, full=True), Record("dispatch-test", 0, 1, {"x": 1}), NoteMixed(0, 1)])
    assert (ex.schedule.next_check, ex.schedule.next_reconcile) == (0.0, 7.0)  # min(0.0, 5.0): the check is due
    assert driver.mixed == {(0, 1)}
    assert '"dispatch-test"' in (tmp_path / "events.jsonl").read_text()


def test_the_action_union_names_every_action_class():
    """control/actions.py's Action (the type the decisions return) lists every action class it defines."""
    from typing import get_args

    from shadowline.control import actions

    defined = {c for c in vars(actions).values() if isinstance(c, type) and c.__module__ == actions.__name__}
    assert set(get_args(actions.Action)) == defined
