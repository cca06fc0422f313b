"""`Deadline`: the time budget every broker call is given, instead of a `-1` "forever".

Contract: a `Deadline` is a frozen point on a monotonic clock. A caller creates one for a
whole operation (`Deadline.after(10.0)`: "ensure the topics within ten seconds") and each
broker call inside it asks `timeout_for_call(max_seconds)` how long it may block: never
longer than what is left of the operation, and never longer than the call's own cap, so a
loop of short calls can notice that the budget ran out. A deadline never returns a
negative timeout, and nothing in `torpor.streams` passes librdkafka's `-1` (block forever).

The clock is injectable so that tests can move time without sleeping; it defaults to
`time.monotonic`, which wall-clock adjustments (NTP, DST) cannot move backwards.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Deadline:
    """A point in monotonic time after which an operation must give up.

    `expires_at` is in the units of `clock` (seconds of `time.monotonic` by default).
    """

    expires_at: float
    clock: Clock = field(default=time.monotonic, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not math.isfinite(self.expires_at):
            # An infinite deadline is the `-1` sentinel in disguise: refuse it.
            raise ValueError(f"a deadline must be finite, got {self.expires_at!r}")

    @classmethod
    def after(cls, seconds: float, *, clock: Clock = time.monotonic) -> Deadline:
        """Return a deadline `seconds` from now. Raises ValueError if `seconds` is negative or not finite."""
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"a deadline needs a finite, non-negative number of seconds, got {seconds!r}")
        return cls(clock() + seconds, clock)

    def remaining(self) -> float:
        """Seconds left before the deadline; 0.0 once it has passed (never negative)."""
        return max(0.0, self.expires_at - self.clock())

    def expired(self) -> bool:
        """True once no time is left."""
        return self.remaining() <= 0.0

    def timeout_for_call(self, max_seconds: float) -> float:
        """The timeout, in seconds, to pass to one broker call: min(remaining, `max_seconds`).

        Returns 0.0 when the deadline has passed; a caller that must not make a
        non-blocking call checks `expired()` first. Raises ValueError if `max_seconds`
        is not positive and finite, since a cap of zero or forever is a bug in the caller.
        """
        if not math.isfinite(max_seconds) or max_seconds <= 0:
            raise ValueError(f"max_seconds must be positive and finite, got {max_seconds!r}")
        return min(self.remaining(), max_seconds)
