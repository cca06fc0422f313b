"""streams/deadline.py: a budget on a clock the test moves, so nothing here sleeps."""

from __future__ import annotations

import math

import pytest

from torpor.streams.deadline import Deadline


class ManualClock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_fresh_deadline_has_its_whole_budget_left() -> None:
    clock = ManualClock()
    deadline = Deadline.after(5.0, clock=clock)

    assert deadline.remaining() == 5.0
    assert not deadline.expired()


def test_each_call_gets_the_smaller_of_its_cap_and_what_is_left() -> None:
    clock = ManualClock()
    deadline = Deadline.after(5.0, clock=clock)

    assert deadline.timeout_for_call(2.0) == 2.0
    clock.now += 4.0
    assert deadline.timeout_for_call(2.0) == 1.0


def test_a_passed_deadline_is_expired_and_never_negative() -> None:
    clock = ManualClock()
    deadline = Deadline.after(1.0, clock=clock)

    clock.now += 3.0

    assert deadline.expired()
    assert deadline.remaining() == 0.0
    assert deadline.timeout_for_call(5.0) == 0.0


def test_a_zero_budget_is_expired_at_once() -> None:
    assert Deadline.after(0).expired()


@pytest.mark.parametrize("seconds", [-1.0, math.inf, math.nan])
def test_a_negative_or_infinite_budget_is_refused(seconds: float) -> None:
    with pytest.raises(ValueError, match="finite, non-negative"):
        Deadline.after(seconds)


@pytest.mark.parametrize("cap", [0.0, -1.0, math.inf])
def test_a_call_cap_of_zero_or_forever_is_refused(cap: float) -> None:
    with pytest.raises(ValueError, match="positive and finite"):
        Deadline.after(1.0).timeout_for_call(cap)


def test_a_deadline_is_a_frozen_value() -> None:
    clock = ManualClock()
    deadline = Deadline.after(1.0, clock=clock)

    assert deadline == Deadline(101.0)  # the clock is not part of the value
    with pytest.raises(AttributeError):
        deadline.expires_at = 0.0  # type: ignore[misc]
