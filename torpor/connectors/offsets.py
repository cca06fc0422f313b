"""A connector's outbox offsets, committed without ever blocking its loop.

Contract. `OutboxOffsets(consumer, topic)`:

- `taken(partition, offset)` records that the dispatch at `offset` is journaled: from then
  on the journal, not the offset, holds its effect, so the offset may be committed;
- `commit_due()` starts one asynchronous commit of what is taken and not committed yet,
  when no commit is in flight and the backoff has passed; it never waits for the broker;
- `on_commit(error, partitions)` is the consumer's `on_commit` callback (librdkafka serves
  it from `consume()`): a partition the broker acknowledged is committed; a refused one
  stays taken, and the next attempt waits a backoff that doubles up to `MAX_BACKOFF`;
- `settled` says whether everything taken is committed;
- `commit_now(timeout)` is the last commit, at the stop: it waits for the broker's answer,
  `timeout` seconds at most.

Why asynchronous: while the group has no coordinator (a broker restart), librdkafka holds
a commit back for up to `session.timeout.ms` (45 s by default) before it fails with
`_WAIT_COORD`. A synchronous commit blocked the connector's loop for all of it, and the
loop then committed again at once: it consumed once per 46 s. A failed or late commit costs
nothing but redelivered dispatches, which the journal absorbs (a journaled request id is
never run twice), so the loop keeps serving while the commit waits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from torpor.streams.errors import translate

log: Final = logging.getLogger(__name__)

# The pace of commits while they succeed: a redelivery after a crash repeats at most this much.
INTERVAL: Final = 1.0
# A refused commit is retried after a backoff that doubles from INTERVAL up to this.
MAX_BACKOFF: Final = 30.0
# librdkafka answers every asynchronous commit, a held-back one after `session.timeout.ms`;
# an answer later than this is taken as lost, so one missing callback cannot stop commits.
LOST_AFTER: Final = 300.0


class OutboxOffsets:
    """Taken and committed outbox offsets of one connector (see the module docstring).

    Not thread-safe, and needs not be: librdkafka runs `on_commit` inside the consumer's
    `consume()`, `poll()` or `close()`, which only the connector's loop calls (or its waiter
    thread, while the loop awaits it: `ConnectorRuntime._wait`).
    """

    def __init__(self, consumer: Consumer, topic: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._consumer = consumer
        self._topic = topic
        self._clock = clock
        self._taken: dict[int, int] = {}  # partition: the next offset, every dispatch before it journaled
        self._committed: dict[int, int] = {}
        self._in_flight_since: float | None = None
        self._due = 0.0
        self._backoff = INTERVAL

    def taken(self, partition: int, offset: int) -> None:
        self._taken[partition] = offset + 1

    @property
    def settled(self) -> bool:
        """Everything taken is committed (nothing would be redelivered after a restart)."""
        return not self._pending()

    def commit_due(self) -> None:
        """Start an asynchronous commit if one is due; never waits for the broker."""
        now = self._clock()
        if self._in_flight_since is not None:
            if now - self._in_flight_since < LOST_AFTER:
                return
            log.warning("outbox commit unanswered for %.0fs: committing again", now - self._in_flight_since)
        pending = self._pending()
        if pending and now >= self._due:
            self._send(pending)

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's answer to a commit: mark what it committed, back off if it refused any."""
        refused = [] if error is None else [error.str()]
        for tp in partitions:
            if tp.topic != self._topic:
                continue
            if error is None and tp.error is None and tp.offset >= 0:
                self._committed[tp.partition] = max(tp.offset, self._committed.get(tp.partition, -1))
            elif tp.error is not None:
                refused.append(f"partition {tp.partition} at {tp.offset}: {tp.error.str()}")
        self._in_flight_since = None
        if refused:
            self._refused("; ".join(refused))
        else:
            self._backoff = INTERVAL
            self._due = self._clock() + INTERVAL

    def commit_now(self, timeout: float) -> None:
        """The last commit, at the stop: waits `timeout` seconds at most for its answer.

        Not a synchronous commit, which would wait out `session.timeout.ms` for a missing
        coordinator: an asynchronous one, and `poll()` serves its answer. A record that
        poll returns is dropped uncommitted; the next owner of its partition reads it again.
        """
        pending = self._pending()
        if not pending:
            return
        self._send(pending)
        deadline = self._clock() + timeout
        while not self.settled and self._clock() < deadline:
            self._consumer.poll(0.1)
        if not self.settled:
            log.warning("outbox offsets not committed at the stop: their dispatches are redelivered at the "
                        "next start, and the journal absorbs them")

    def _pending(self) -> dict[int, int]:
        return {p: o for p, o in self._taken.items() if self._committed.get(p, -1) < o}

    def _send(self, pending: dict[int, int]) -> None:
        self._in_flight_since = self._clock()
        offsets = [TopicPartition(self._topic, p, o) for p, o in sorted(pending.items())]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:  # refused before it was sent (a fatal error, a closed consumer)
            self._in_flight_since = None
            self._refused(str(translate(exc, operation="commit outbox offsets")))

    def _refused(self, why: str) -> None:
        self._due = self._clock() + self._backoff
        log.warning("outbox commit failed, retried in %.0fs (the dispatches stay journaled, a redelivery is "
                    "absorbed): %s", self._backoff, why)
        self._backoff = min(self._backoff * 2, MAX_BACKOFF)
