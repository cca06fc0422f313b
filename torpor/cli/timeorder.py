"""Events and receipts in time order: a merge of partitions that never reorders one partition.

`torpor tail` reads two topics (`events`, `receipts`) of several partitions each; the
consumer hands them over partition by partition, so read order is not time order (all of
a thread's events, then all of its receipts). `TimeOrder` holds the records read and
releases them oldest first by their record's `created_at`, choosing only among the heads
of the partitions' queues: a partition's records always come out in offset order, so the
position just past a released record is a true resume point (everything before it in
its partition was released). Ties go to the record read first.

What it holds is bounded: past `window` records it releases the oldest until half are
left, so a partition read far ahead of the others is not held whole (the order is then
time order within what is held). `drain` releases the rest, in order.

A record that did not decode has no time: it comes out right after the record before it
in its partition.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from typing import Final

from torpor.streams.observer import Item, Observed

WINDOW: Final = 50_000
"""Records held at most before the oldest are released (a tail of a busy topic from the start)."""


class TimeOrder:
    """A time-ordered merge of the records of several partitions (module docstring)."""

    __slots__ = ("_arrival", "_held", "_last_time", "_queues", "_window")

    def __init__(self, window: int = WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self._window = window
        self._queues: dict[tuple[str, int], deque[tuple[int, int, Item]]] = {}
        self._last_time: dict[tuple[str, int], int] = {}
        self._arrival = itertools.count()
        self._held = 0

    def add(self, item: Item) -> Iterator[Item]:
        """Hold `item`; yields the records released to keep within the window (often none)."""
        where = (item.topic, item.partition)
        when = item.record.created_at if isinstance(item, Observed) else self._last_time.get(where, 0)
        self._last_time[where] = when
        self._queues.setdefault(where, deque()).append((when, next(self._arrival), item))
        self._held += 1
        if self._held > self._window:
            while self._held > self._window // 2:
                yield self._release()

    def drain(self) -> Iterator[Item]:
        """Every record held, oldest first (each partition's in offset order)."""
        while self._held:
            yield self._release()

    def __len__(self) -> int:
        return self._held

    def _release(self) -> Item:
        where = min((q[0][:2], key) for key, q in self._queues.items() if q)[1]
        _, _, item = self._queues[where].popleft()
        self._held -= 1
        return item
