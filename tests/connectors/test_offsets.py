"""`connectors.offsets`: outbox commits are asynchronous, one at a time, and back off when refused.

A recording consumer stands in for librdkafka: it keeps each commit and answers only when
the test says so, as a broker without a group coordinator would (late, or with an error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from torpor.connectors.offsets import INTERVAL, LOST_AFTER, MAX_BACKOFF, OutboxOffsets

TOPIC = "t.outbox"


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class RecordingConsumer:
    """Keeps every asynchronous commit; `poll` answers the last one through `answer`."""

    commits: list[list[tuple[int, int]]] = field(default_factory=list)
    answer: Any = None

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> None:
        assert asynchronous, "a commit must never block the connector's loop"
        self.commits.append([(tp.partition, tp.offset) for tp in offsets])

    def poll(self, timeout: float) -> None:
        if self.answer is not None:
            self.answer()


def _offsets() -> tuple[OutboxOffsets, RecordingConsumer, Clock]:
    consumer, clock = RecordingConsumer(), Clock()
    return OutboxOffsets(consumer, TOPIC, clock=clock), consumer, clock  # type: ignore[arg-type]


def _acknowledge(offsets: OutboxOffsets, committed: list[tuple[int, int]]) -> None:
    offsets.on_commit(None, [TopicPartition(TOPIC, p, o) for p, o in committed])


def test_taken_offsets_are_committed_asynchronously_one_commit_at_a_time() -> None:
    offsets, consumer, clock = _offsets()
    offsets.taken(0, 4)
    offsets.taken(2, 9)
    offsets.commit_due()
    assert consumer.commits == [[(0, 5), (2, 10)]] and not offsets.settled
    offsets.taken(0, 5)
    clock.now += 60  # unanswered for a minute (a coordinator that is away): no second commit piles up
    offsets.commit_due()
    assert len(consumer.commits) == 1
    _acknowledge(offsets, [(0, 5), (2, 10)])
    assert not offsets.settled  # offset 5 of partition 0 came after the commit
    offsets.commit_due()
    assert len(consumer.commits) == 1  # the pace: one interval after an answer
    clock.now += INTERVAL
    offsets.commit_due()
    assert consumer.commits[-1] == [(0, 6)]
    _acknowledge(offsets, [(0, 6)])
    assert offsets.settled


def test_a_refused_commit_is_retried_after_a_backoff_that_doubles_up_to_its_ceiling() -> None:
    offsets, consumer, clock = _offsets()
    offsets.taken(1, 0)
    waits = []
    for _ in range(8):
        offsets.commit_due()
        sent = len(consumer.commits)
        offsets.on_commit(KafkaError(KafkaError._WAIT_COORD), [TopicPartition(TOPIC, 1, 1)])
        started = clock.now
        while len(consumer.commits) == sent:
            clock.now += 0.5
            offsets.commit_due()
        waits.append(clock.now - started)
    assert waits[:3] == [INTERVAL, 2 * INTERVAL, 4 * INTERVAL]
    assert max(waits) == MAX_BACKOFF
    assert not offsets.settled
    _acknowledge(offsets, [(1, 1)])
    assert offsets.settled


@dataclass
class Answered:
    """A partition of librdkafka's answer with an error of its own (TopicPartition's is read-only)."""

    topic: str
    partition: int
    offset: int
    error: KafkaError | None


def test_a_partition_refused_alone_stays_pending_and_the_others_are_committed() -> None:
    offsets, consumer, clock = _offsets()
    offsets.taken(0, 0)
    offsets.taken(1, 0)
    offsets.commit_due()
    answer = [Answered(TOPIC, 0, 1, None), Answered(TOPIC, 1, 1, KafkaError(KafkaError.NOT_COORDINATOR))]
    offsets.on_commit(None, answer)  # type: ignore[arg-type]
    assert not offsets.settled
    clock.now += MAX_BACKOFF
    offsets.commit_due()
    assert consumer.commits[-1] == [(1, 1)]


def test_a_commit_never_answered_does_not_stop_later_commits() -> None:
    offsets, consumer, clock = _offsets()
    offsets.taken(0, 0)
    offsets.commit_due()
    clock.now += LOST_AFTER
    offsets.commit_due()
    assert len(consumer.commits) == 2


def test_the_last_commit_waits_for_its_answer_but_no_longer_than_its_timeout() -> None:
    offsets, consumer, clock = _offsets()
    offsets.taken(0, 7)
    consumer.answer = lambda: _acknowledge(offsets, [(0, 8)])
    offsets.commit_now(timeout=5.0)
    assert offsets.settled and consumer.commits == [[(0, 8)]]

    offsets.taken(0, 8)

    def never() -> None:
        clock.now += 1.0

    consumer.answer = never
    offsets.commit_now(timeout=5.0)  # returns at the deadline, with a warning
    assert not offsets.settled
