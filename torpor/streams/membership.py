"""`GroupWatch`: telling a consumer that lost its group for good from one that is rejoining.

Why: after a broker restart, librdkafka's consumer can stay out of its group for good
(confluentinc/librdkafka#2944): its session times out ("SESSTMOUT ... without a successful
response from the group coordinator (broker -1)"), it revokes its partitions, and then it
never finds the coordinator again, never joins, and raises no error. A connector in that
state takes no dispatch until it is restarted; the fault harness saw one such stall in
about ten runs. A consumer that is merely rejoining (a rebalance, a broker restart within
the session timeout, a coordinator that moved) has its member id again within a session
timeout or two. So: a consumer whose member id (`Consumer.memberid()`) has been empty for
`stuck_after_s` straight is stuck, and its owner replaces it with a new one.

The watch is a pure function of what it is told: the member id seen and the time it was
seen (a monotonic clock), so its decisions are tested without a broker. `stuck_after_s`
for a consumer config: `stuck_after_for(config)`, two session timeouts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

SESSION_TIMEOUT_MS: Final = 45_000
"""librdkafka's default `session.timeout.ms`, when the config does not set one."""

SESSIONS_BEFORE_STUCK: Final = 2
"""Session timeouts a consumer may spend without a member id before it counts as stuck. A
healthy consumer without one is joining, which a broker answers within a rebalance (bounded
by the members' session timeouts); the stuck one of #2944 never joins. Two leave a healthy
join room to finish, and bound a stuck connector's stall to a minute and a half by default."""


def stuck_after_for(config: Mapping[str, object]) -> float:
    """Seconds without a member id after which a consumer with `config` is stuck."""
    session_ms = config.get("session.timeout.ms", SESSION_TIMEOUT_MS)
    return SESSIONS_BEFORE_STUCK * float(session_ms) / 1000.0  # type: ignore[arg-type]


class GroupWatch:
    """Whether a consumer has been out of its group for `stuck_after_s` straight."""

    __slots__ = ("_since", "stuck_after_s")

    def __init__(self, stuck_after_s: float) -> None:
        if stuck_after_s <= 0:
            raise ValueError(f"stuck_after_s must be positive, not {stuck_after_s}")
        self.stuck_after_s = stuck_after_s
        self._since: float | None = None  # when the member id was first seen empty, this streak

    def stuck(self, member_id: str | None, now: float) -> bool:
        """Note that the consumer's member id was `member_id` at `now`; True once the id has
        been empty (None or "") for `stuck_after_s`. Then the streak starts over: the owner
        replaces the consumer, and the new one gets as long to join."""
        if member_id:
            self._since = None
            return False
        if self._since is None:
            self._since = now
            return False
        if now - self._since < self.stuck_after_s:
            return False
        self._since = None
        return True
