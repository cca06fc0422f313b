"""`GroupWatch`: a consumer out of its group for two session timeouts straight is stuck."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torpor.streams.membership import SESSION_TIMEOUT_MS, GroupWatch, stuck_after_for


def test_the_limit_is_two_session_timeouts_of_the_config_or_of_librdkafkas_default() -> None:
    assert stuck_after_for({"session.timeout.ms": 10_000}) == 20.0
    assert stuck_after_for({}) == 2 * SESSION_TIMEOUT_MS / 1000
    with pytest.raises(ValueError):
        GroupWatch(0)


def test_a_member_id_that_comes_back_in_time_never_counts_as_stuck() -> None:
    watch = GroupWatch(90)
    assert not watch.stuck("m-1", 0)
    assert not watch.stuck("", 10)  # a broker restart: the session is rejoining
    assert not watch.stuck(None, 99)  # 89 s without one: not yet
    assert not watch.stuck("m-1", 100)
    assert not watch.stuck("", 150)  # a new streak starts here
    assert not watch.stuck("", 239)


def test_a_member_id_empty_for_the_limit_is_stuck_once_then_the_new_consumer_gets_as_long() -> None:
    watch = GroupWatch(90)
    assert not watch.stuck("", 0)
    assert watch.stuck("", 90)
    assert not watch.stuck("", 91)  # the replacement's own streak starts
    assert not watch.stuck(None, 180)
    assert watch.stuck(None, 181)


@given(st.lists(st.tuples(st.sampled_from(["", None, "m"]), st.floats(0, 60)), max_size=40))
def test_stuck_exactly_when_an_empty_streak_reaches_the_limit(seen: list[tuple[str | None, float]]) -> None:
    watch, now, since = GroupWatch(90), 0.0, None
    for member_id, step in seen:
        now += step
        expected = False
        if member_id:
            since = None
        elif since is None:
            since = now
        elif now - since >= 90:
            expected, since = True, None
        assert watch.stuck(member_id, now) is expected
