"""`wait_until`: the answer it returns, and what it says when the deadline passes."""

from __future__ import annotations

import pytest

from tests.waiting import wait_until


def test_the_first_answer_that_is_not_none_or_false_is_returned() -> None:
    answers = iter([None, False, 0])
    assert wait_until(lambda: next(answers), 5, "an answer") == 0


def test_a_message_function_is_called_at_the_deadline_not_before() -> None:
    seen: list[int] = []
    calls = 0

    def condition() -> bool:
        seen.append(len(seen))
        return False

    def message() -> str:
        nonlocal calls
        calls += 1
        return f"the condition ran {len(seen)} times"

    with pytest.raises(AssertionError) as raised:
        wait_until(condition, 0.05, message)
    assert calls == 1 and seen
    assert f"the condition ran {len(seen)} times" in str(raised.value)
    assert "last it returned False" in str(raised.value)
