"""shadowline.control.failover.drain: how long a handover waits for the serving engine's streams to end after its
worker left the frontend's routing, on a fake clock (the deroute itself runs against the real frontend in
tests/slurm/test_discovery.py, the whole handover under load in tests/e2e/test_drills.py's upgrade)."""

from __future__ import annotations

from collections.abc import Iterable

from shadowline.control.failover import DRAIN_POLL_S, DRAIN_SETTLE_S, drain


class Clock:
    """A monotonic clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def reader(values: Iterable[float | None]):  # noqa: ANN201 (a callable returning the next value)
    it = iter(values)
    return lambda: next(it)


def test_an_idle_engine_is_ended_after_the_settle_only() -> None:
    clock = Clock()
    out = drain(reader([0.0]), 5.0, clock, clock.sleep)
    assert out == {"drain_s": DRAIN_SETTLE_S, "running_left": 0.0}
    assert clock.slept == [DRAIN_SETTLE_S]


def test_streams_in_flight_are_waited_for_until_none_runs() -> None:
    clock = Clock()
    out = drain(reader([2.0, 1.0, 1.0, 0.0]), 5.0, clock, clock.sleep)
    assert out["running_left"] == 0.0
    assert abs(out["drain_s"] - (DRAIN_SETTLE_S + 3 * DRAIN_POLL_S)) < 1e-9


def test_the_grace_bounds_the_drain_of_an_engine_that_never_idles() -> None:
    clock = Clock()
    out = drain(reader([3.0] * 1000), 0.5, clock, clock.sleep)
    assert out["running_left"] == 3.0
    assert 0.5 <= out["drain_s"] < 0.5 + DRAIN_POLL_S + 1e-9


def test_an_engine_whose_metrics_say_nothing_is_not_waited_for_beyond_the_settle() -> None:
    clock = Clock()
    out = drain(reader([None]), 5.0, clock, clock.sleep)
    assert out == {"drain_s": DRAIN_SETTLE_S, "running_left": None}


def test_a_grace_shorter_than_the_settle_is_kept() -> None:
    clock = Clock()
    out = drain(reader([4.0]), 0.05, clock, clock.sleep)
    assert out == {"drain_s": 0.05, "running_left": 4.0}
