"""Waiting for an asynchronous fact in tests, without `sleep`.

`wait_until(condition, timeout, message)` calls `condition` until it returns something
other than None or False, and returns that value. At the deadline it raises
AssertionError with `message` and the last value (or exception) the condition gave, so
a failing test says what it was still seeing. `message` may be a function, called only
then: a process's log read at the deadline, not as it was when the wait began (an
f-string with the log in it showed the log before anything had happened).

Exceptions raised by `condition` count as "not yet" (a broker still electing a leader
raises), but the last one is reported if time runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, TypeVar

T = TypeVar("T")

# Start fast (most broker facts settle within tens of milliseconds), back off to a
# ceiling that keeps the loop from hammering a broker on two cores.
FIRST_PAUSE: Final = 0.01
MAX_PAUSE: Final = 0.25


def wait_until(
        condition: Callable[[], T | bool | None], timeout: float, message: str | Callable[[], str]) -> T:
    """Return the first truthy-enough result of `condition`; raise AssertionError after `timeout` s.

    None and False mean "not yet"; any other value (including 0 or an empty list) is the answer.
    """
    deadline = time.monotonic() + timeout
    pause = FIRST_PAUSE
    last: str = "nothing: the condition never ran"
    while True:
        try:
            value = condition()
        except Exception as exc:
            last = f"it raised {type(exc).__name__}: {exc}"
        else:
            if value is not None and value is not False:
                # `T | bool | None` cannot exclude bool from T, so the narrowing is ours.
                return value  # type: ignore[return-value]
            last = f"it returned {value!r}"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            said = message if isinstance(message, str) else message()
            raise AssertionError(f"{said} (after {timeout:.1f}s, last {last})")
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, MAX_PAUSE)
