"""The lifecycle of one assigned partition, as a checked state machine.

Every `inputs` partition a processor owns moves through these states, and only along
the arrows; `PartitionLifecycle.transition_to` refuses any other move, naming the
partition and both states, because a partition folded before its store is restored
(or after it is revoked) would break exactly-once silently::

    ASSIGNED ──> RESTORING ──> RUNNING ──> REVOKING ──> CLOSED
        │            │                         ▲
        │            └─────────────────────────┤   revoked (or lost) while restoring
        └──────────────────────────────────────┘   revoked before the restore began

- `ASSIGNED`:  the group gave us the partition; its store is not open yet.
- `RESTORING`: the store is open and catching up from the changelog; nothing is folded.
- `RUNNING`:   the store is restored and its input offset matches the group's committed
               offset; inputs are folded into the open checkpoint.
- `REVOKING`:  the group is taking the partition away: the open checkpoint is committed
               or aborted within the revoke budget, then the store is closed.
- `CLOSED`:    terminal. A later assignment of the same partition starts a new lifecycle.

This module holds no I/O; it only says which moves are legal (`TRANSITIONS` is the
whole table).
"""

from __future__ import annotations

import enum
from typing import Final

from torpor.schemas.errors import TorporError


class PartitionState(enum.Enum):
    """Where one owned partition is in its life (see the module diagram)."""

    ASSIGNED = "assigned"
    RESTORING = "restoring"
    RUNNING = "running"
    REVOKING = "revoking"
    CLOSED = "closed"


TRANSITIONS: Final[dict[PartitionState, frozenset[PartitionState]]] = {
    PartitionState.ASSIGNED: frozenset({PartitionState.RESTORING, PartitionState.REVOKING}),
    PartitionState.RESTORING: frozenset({PartitionState.RUNNING, PartitionState.REVOKING}),
    PartitionState.RUNNING: frozenset({PartitionState.REVOKING}),
    PartitionState.REVOKING: frozenset({PartitionState.CLOSED}),
    PartitionState.CLOSED: frozenset(),
}


class IllegalTransitionError(TorporError):
    """A partition was asked to move along an arrow the lifecycle does not have.

    This is a bug in the loop, not an operational condition: nothing should catch it.
    """


class PartitionLifecycle:
    """The current state of one partition, changed only through `transition_to`."""

    __slots__ = ("_state", "partition", "topic")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._state = PartitionState.ASSIGNED

    @property
    def state(self) -> PartitionState:
        """The state the partition is in now."""
        return self._state

    def is_running(self) -> bool:
        """True while inputs of this partition may be folded."""
        return self._state is PartitionState.RUNNING

    def transition_to(self, new: PartitionState) -> None:
        """Move to `new`. Raises IllegalTransitionError if the table has no such arrow."""
        if new not in TRANSITIONS[self._state]:
            raise IllegalTransitionError(
                f"partition {self.topic}[{self.partition}] cannot go from {self._state.value} "
                f"to {new.value}; allowed: {sorted(s.value for s in TRANSITIONS[self._state]) or 'none'}"
            )
        self._state = new

    def __repr__(self) -> str:
        return f"PartitionLifecycle({self.topic}[{self.partition}]: {self._state.value})"
