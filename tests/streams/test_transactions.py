"""Kafka transactions as the processor uses them, on a real broker, through streams/config.py.

What exactly-once rests on (DESIGN.md, section 6): records of an aborted transaction are
invisible to read_committed readers even once they are in the log; offsets sent with a
transaction move the group only when it commits; and a restarted instance with the same
transactional id fences its predecessor, whose next call is a `FencedError`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaException,
    Producer,
    TopicPartition,
)

from tests.conftest import TopicFactory
from tests.waiting import wait_until
from torpor.schemas.errors import FencedError
from torpor.streams.clients import make_consumer, make_producer
from torpor.streams.config import KafkaSettings, Settings, consumer_config
from torpor.streams.errors import ProducerFencedError, translate

CALL_TIMEOUT = 15.0  # seconds for one transactional call on a two-core CI machine


@pytest.fixture
def settings(kafka_bootstrap: str) -> Settings:
    return Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap))


@pytest.fixture
def consumers() -> Iterator[list[Consumer]]:
    """Consumers the test opens; each is closed afterwards, so the group leaves cleanly."""
    opened: list[Consumer] = []
    yield opened
    for consumer in opened:
        consumer.close()


def unique(name: str) -> str:
    return f"test-{name}-{uuid.uuid4().hex[:8]}"


def transactional(settings: Settings) -> Producer:
    producer = make_producer(settings, transactional_id=unique("txn"))
    producer.init_transactions(CALL_TIMEOUT)
    return producer


def reader(
    settings: Settings, consumers: list[Consumer], topic: str, *, committed_only: bool = True
) -> Consumer:
    conf = consumer_config(settings, unique("reader"))
    if not committed_only:
        conf["isolation.level"] = "read_uncommitted"  # the test's control reader, never Torpor's
    consumer = Consumer(conf)
    consumers.append(consumer)
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    return consumer


def values_until(consumer: Consumer, last: bytes) -> list[bytes]:
    """Every value `consumer` reads up to and including `last`."""
    seen: list[bytes] = []

    def reached_last() -> bool:
        message = consumer.poll(0.2)
        if message is None:
            return False
        assert message.error() is None, message.error()
        value = message.value()
        assert isinstance(value, bytes)
        seen.append(value)
        return value == last

    wait_until(reached_last, timeout=60, message=f"{last!r} never arrived; read so far: {seen}")
    return seen


def high_watermark(consumer: Consumer, topic: str) -> int:
    """The end offset the broker reports to `consumer`, by its isolation level."""
    _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=CALL_TIMEOUT, cached=False)
    return int(high)


@pytest.mark.kafka
def test_an_aborted_transaction_is_invisible_to_read_committed_but_in_the_log(
    settings: Settings, topic_factory: TopicFactory, consumers: list[Consumer]
) -> None:
    topic = topic_factory()
    producer = transactional(settings)
    committed_reader = reader(settings, consumers, topic)
    control_reader = reader(settings, consumers, topic, committed_only=False)

    producer.begin_transaction()
    for n in range(3):
        producer.produce(topic, key=b"t1", value=f"aborted-{n}".encode())
    assert producer.flush(CALL_TIMEOUT) == 0
    # Flushed: the records are in the partition's log before the abort, not only in a
    # buffer. A read_committed reader's end is the last stable offset, held before them.
    assert high_watermark(control_reader, topic) == 3
    assert high_watermark(committed_reader, topic) == 0
    producer.abort_transaction(CALL_TIMEOUT)
    producer.begin_transaction()
    producer.produce(topic, key=b"t1", value=b"committed")
    producer.commit_transaction(CALL_TIMEOUT)

    assert values_until(committed_reader, b"committed") == [b"committed"]
    everything = [b"aborted-0", b"aborted-1", b"aborted-2", b"committed"]
    assert values_until(control_reader, b"committed") == everything


@pytest.mark.kafka
def test_a_committed_transaction_is_visible_to_read_committed(
    settings: Settings, topic_factory: TopicFactory, consumers: list[Consumer]
) -> None:
    topic = topic_factory()
    producer = transactional(settings)

    producer.begin_transaction()
    for n in range(3):
        producer.produce(topic, key=b"t1", value=f"turn-{n}".encode())
    producer.commit_transaction(CALL_TIMEOUT)

    assert values_until(reader(settings, consumers, topic), b"turn-2") == [b"turn-0", b"turn-1", b"turn-2"]


@pytest.mark.kafka
def test_offsets_sent_with_a_transaction_move_the_group_only_when_it_commits(
    settings: Settings, topic_factory: TopicFactory, consumers: list[Consumer]
) -> None:
    source, sink = topic_factory(), topic_factory()
    feeder = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    for n in range(5):
        feeder.produce(source, key=b"t1", value=f"input-{n}".encode())
    assert feeder.flush(CALL_TIMEOUT) == 0
    consumer = make_consumer(settings, unique("processor"))
    consumers.append(consumer)
    consumer.assign([TopicPartition(source, 0, OFFSET_BEGINNING)])
    assert values_until(consumer, b"input-4")[-1] == b"input-4"
    positions = consumer.position([TopicPartition(source, 0)])
    assert positions[0].offset == 5
    producer = transactional(settings)

    def committed_offset() -> int:
        [partition] = consumer.committed([TopicPartition(source, 0)], timeout=CALL_TIMEOUT)
        return int(partition.offset)

    producer.begin_transaction()
    producer.produce(sink, key=b"t1", value=b"output")
    producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), CALL_TIMEOUT)
    producer.abort_transaction(CALL_TIMEOUT)

    assert committed_offset() == OFFSET_INVALID  # the group never committed anything

    producer.begin_transaction()
    producer.produce(sink, key=b"t1", value=b"output")
    producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), CALL_TIMEOUT)
    producer.commit_transaction(CALL_TIMEOUT)

    wait_until(lambda: committed_offset() == 5, timeout=60, message="the committed offset never reached 5")


@pytest.mark.kafka
def test_a_restarted_instance_fences_its_predecessor_and_aborts_its_open_transaction(
    settings: Settings, topic_factory: TopicFactory, consumers: list[Consumer]
) -> None:
    topic = topic_factory()
    transactional_id = unique("instance")
    zombie = make_producer(settings, transactional_id=transactional_id)
    zombie.init_transactions(CALL_TIMEOUT)
    zombie.begin_transaction()
    zombie.produce(topic, key=b"t1", value=b"zombie")
    assert zombie.flush(CALL_TIMEOUT) == 0

    successor = make_producer(settings, transactional_id=transactional_id)
    successor.init_transactions(CALL_TIMEOUT)  # fences the zombie and aborts its transaction
    successor.begin_transaction()
    successor.produce(topic, key=b"t1", value=b"successor")
    successor.commit_transaction(CALL_TIMEOUT)

    with pytest.raises(KafkaException) as caught:
        zombie.commit_transaction(CALL_TIMEOUT)
    translated = translate(caught.value, operation="commit_transaction")
    assert isinstance(translated, ProducerFencedError)
    assert isinstance(translated, FencedError)
    assert "commit_transaction failed" in str(translated)
    assert "do not retry" in str(translated)
    assert values_until(reader(settings, consumers, topic), b"successor") == [b"successor"]
