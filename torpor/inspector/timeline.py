"""A thread's timeline for the page: its snapshot, then every later record exactly once.

Contract. `timeline(settings, thread_id, resume, stopped)` yields `(position, message)`
pairs. Without `resume`, the first is the thread's `Observer.snapshot` (history entries,
committed events, the live text of a completion in flight, and whether it is complete),
and the position just past it; then each later record of the thread on `events` and
`receipts` (the thread's receipts from the first retained one), each with the position
just past it. With `resume` (a position the client had, sent back as SSE's
`Last-Event-ID`), only the records after it. So a client that reconnects with the last
position it received sees nothing twice and misses nothing: the snapshot and the follow
are one pass over the log, cut at positions (torpor.streams.observer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from torpor.inspector.plain import item_json, plain
from torpor.streams.config import Settings
from torpor.streams.observer import BEGINNING, Observer, Position, Undecodable
from torpor.streams.topics import TopicNames

Message = dict[str, object]


def timeline(settings: Settings, thread_id: str, resume: Position | None,
             stopped: Callable[[], bool]) -> Iterator[tuple[Position, Message]]:
    receipts = TopicNames.for_prefix(settings.topics.prefix).receipts
    with Observer(settings, receipts=True) as observer:
        if resume is None:
            snapshot = observer.snapshot(thread_id)
            position = snapshot.position.copy()
            position.offsets.setdefault((receipts, observer.partition_of(thread_id, receipts)), BEGINNING)
            yield position, {
                "kind": "snapshot",
                "entries": [plain(e) for e in snapshot.entries],
                "events": [plain(e) for e in snapshot.events],
                "partial": snapshot.partial,
                "missing": snapshot.missing,
                "undecodable": [u.reason for u in snapshot.undecodable],
            }
        else:
            position = resume
        steps = observer.read(position, until_end=False, all_partitions=False, stop=stopped)
        try:
            for step in steps:
                item = step.item
                if isinstance(item, Undecodable) or item.thread_id == thread_id:
                    yield step.position, {"kind": "record", **item_json(item)}
        finally:
            steps.close()
