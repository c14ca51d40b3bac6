"""One relaunch decision on both paths (common/policy.py ``RelaunchPolicy.after_death``): the node agent's driver
(control/driver_duties.relaunch_due, with stable_due's reset of a running generation) and the Slurm supervisor's
slot bookkeeping (slurm/slots.relaunch_decision, StepSlot.book) fed the same deaths give the same delays and give
up at the same death. No process, no etcd, no srun."""

from __future__ import annotations

from typing import NamedTuple

from shadowline.common.coordination import FAILED, RUNNING
from shadowline.common.policy import RelaunchDecision
from shadowline.control.driver_duties import relaunch_due, stable_due
from shadowline.control.memory import DriverMemory
from shadowline.control.view import Now
from shadowline.slurm.slots import ACTIVE, PARKED, Step, StepSlot, relaunch_decision

from .test_agent_driver import HOSTS, POLICY, view
from .test_agent_node import FAILOVER, NOW, T0, memory, slot


class Death(NamedTuple):
    ran_s: float  # from the generation's launch to its death
    reached: str | None = None  # its leader parked (standby) or served (active) this long after the launch
    reached_after_s: float = 0.0


# FAILOVER: relaunch_backoff_s 1, relaunch_backoff_max_s 30, max_relaunch_attempts 3, stable_after_s 30
DEATHS = [
    Death(2.0),  # a quick death: 1 s
    Death(5.0),  # another: 2 s
    Death(120.0, PARKED, 20.0),  # a long healthy run, parked: the count starts again, relaunched at once
    Death(3.0),  # quick: 1 s
    Death(12.0, ACTIVE, 4.0),  # promoted, served, died soon after its launch: quick all the same, 2 s
    Death(1.0),  # quick: 4 s
    Death(10.0, PARKED, 6.0),  # parked and died soon: the fourth quick death in a row, past 3: given up
]
EXPECTED = [(1, 1.0), (2, 2.0), (0, 0.0), (1, 1.0), (2, 2.0), (3, 4.0), (4, None)]


def agent_path(deaths: list[Death]) -> list[tuple[int, float | None]]:
    """Each death as the driver sees it: the generation launched (its launched_at), maybe running (parked or
    serving) and stable_due's reset, then failed and gone on every node: relaunch_due's swap."""
    outcomes: list[tuple[int, float | None]] = []
    attempts, generation = 0, 1
    for death in deaths:
        died = T0 - 1
        launched = died - death.ran_s
        if death.reached:
            running = slot(1, generation, RUNNING, attempts=attempts, since=launched + death.reached_after_s)
            reset = stable_due(running, 11, FAILOVER, Now(wall=died - 0.5, mono=NOW.mono - 0.5))
            attempts = reset[0].slot.attempts if reset else attempts
        failed = slot(1, generation, FAILED, since=died, attempts=attempts, reason="rank-exited")
        gone = view(failed, gone={(1, generation): {h: died + 0.5 for h in HOSTS}})
        driver = DriverMemory(launched_at={(1, generation): launched})
        swap = relaunch_due(failed, 11, gone, HOSTS, driver, memory(), POLICY, NOW)[-1]
        attempts = swap.slot.attempts
        if swap.kind == "dead":
            outcomes.append((attempts, None))
            break
        assert swap.kind == "relaunch"
        outcomes.append((attempts, round(swap.launch_at - NOW.wall, 6)))
        generation += 1
    return outcomes


def slurm_path(deaths: list[Death]) -> list[tuple[int, float | None]]:
    """Each death as the supervisor sees it: the cohort's step in its slot, maybe reaching a state, then ended:
    relaunch_decision and the slot's bookkeeping (Watch.step_ended's)."""
    outcomes: list[tuple[int, float | None]] = []
    cohort = StepSlot("cohort_1")
    for generation, death in enumerate(deaths, start=1):
        step = Step("cohort_1", generation, popen=None, log_path="", started=T0)  # type: ignore[arg-type]
        step.reached = death.reached
        step.ended = T0 + death.ran_s
        cohort.step = step
        decision = relaunch_decision(cohort, step, POLICY)
        cohort.book(decision, now=0.0)
        if cohort.given_up:
            assert cohort.due is None
            outcomes.append((cohort.attempts, None))
            break
        assert cohort.due is not None
        outcomes.append((cohort.attempts, round(cohort.due, 6)))
    return outcomes


def test_the_agent_and_the_supervisor_decide_alike():
    assert agent_path(DEATHS) == EXPECTED
    assert slurm_path(DEATHS) == EXPECTED


def test_reaching_a_state_is_no_reset_on_either_path():
    """A cohort that parks and dies within stable_after_s, again and again, is given up on both paths (the
    supervisor used to start its count again each time its leader parked: it never gave up)."""
    deaths = [Death(8.0, PARKED, 3.0)] * 5
    assert agent_path(deaths) == slurm_path(deaths) == [(1, 1.0), (2, 2.0), (3, 4.0), (4, None)]


def test_after_death_is_the_policy_arithmetic():
    assert POLICY.after_death(0, 2.0) == RelaunchDecision(1, gives_up=False, delay_s=1.0)
    assert POLICY.after_death(2, None) == RelaunchDecision(3, gives_up=False, delay_s=4.0)  # never started
    assert POLICY.after_death(3, 29.9) == RelaunchDecision(4, gives_up=True, delay_s=0.0)
    assert POLICY.after_death(3, 30.0) == RelaunchDecision(0, gives_up=False, delay_s=0.0)
