"""streams/partitioner.py: Kafka's murmur2 vectors, librdkafka's own hash, and a real broker."""

from __future__ import annotations

import confluent_kafka
import pytest
from confluent_kafka import KafkaError, Message, Producer
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import TopicFactory
from torpor.streams.config import KafkaSettings, Settings, producer_config
from torpor.streams.partitioner import murmur2, partition_for

# Apache Kafka's clients UtilsTest.testMurmur2, plus the empty array, which Java hashes too.
JAVA_VECTORS: dict[bytes, int] = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"": 275646681,
}


@pytest.mark.parametrize(("data", "expected"), JAVA_VECTORS.items(), ids=lambda v: repr(v))
def test_murmur2_gives_javas_signed_value(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_every_tail_length_is_hashed_like_java() -> None:
    # One vector per remainder length 0..3 (24, 25, 26, 27 bytes), from Kafka's tests.
    assert murmur2(b"string-f-24-chars-length") == 124730809
    assert murmur2(b"string-fo-25-chars-length") == 1269511650
    assert murmur2(b"string-foo-26-chars-length") == 119165628
    assert murmur2(b"string-last-27-chars-length") == 1089971754


def test_partition_for_clears_the_sign_bit_rather_than_taking_abs() -> None:
    # foobar hashes negative: (h & 0x7fffffff) % 50 is 16, whereas abs(h) % 50 would be 32.
    assert partition_for(b"foobar", 50) == 16
    assert partition_for(b"21", 1) == 0


def test_partition_for_refuses_a_topic_without_partitions() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        partition_for(b"k", 0)


@given(key=st.binary(max_size=200), partitions=st.integers(min_value=1, max_value=1000))
def test_partition_for_agrees_with_librdkafkas_murmur2_partitioner(key: bytes, partitions: int) -> None:
    # confluent_kafka.murmur2 is librdkafka's own partitioner function, the one
    # `partitioner=murmur2_random` calls for every keyed record.
    assert partition_for(key, partitions) == confluent_kafka.murmur2(key, partitions)


@pytest.mark.kafka
def test_keyed_records_land_on_the_partition_partition_for_names(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    partitions = 7  # prime, so that a wrong hash cannot agree by accident of a power of two
    topic = topic_factory(partitions=partitions)
    producer = Producer(producer_config(Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap))))
    keys = [f"thread-{n}".encode() for n in range(200)] + list(JAVA_VECTORS)
    landed: dict[bytes, int] = {}
    failures: list[KafkaError] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            failures.append(error)
            return
        key = message.key()
        assert isinstance(key, bytes)
        landed[key] = message.partition()

    for key in keys:
        producer.produce(topic, key=key, value=b"v", on_delivery=delivered)
    assert producer.flush(30) == 0, "records still in flight after 30 s"

    assert failures == []
    assert set(landed) == set(keys)
    assert len(set(landed.values())) == partitions  # every partition was exercised
    assert {key: partition_for(key, partitions) for key in keys} == landed
