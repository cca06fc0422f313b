"""Reading and creating benchmark topics directly, with plain confluent-kafka clients.

Contract. `read_topic(bootstrap, topic)` returns every committed record of `topic`
(read_committed, all partitions, from the start up to the high watermark seen when it
began) as (partition, key, value); `create_topics` creates topics and waits for them;
`delete_topics` deletes them (best effort, a benchmark's cleanup); `produce_queued`
produces one record, waiting for deliveries to drain a full queue.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # what confluent_kafka.admin re-exports, typed

READ_TIMEOUT_S: Final = 120.0

Record = tuple[int, bytes, bytes]


def read_topic(bootstrap: str, topic: str) -> list[Record]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-read-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        partitions = sorted(metadata.partitions)
        ends: dict[int, int] = {}
        for p in partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            ends[p] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions if ends[p] > 0])
        records: list[Record] = []
        left = {p for p in partitions if ends[p] > 0}
        deadline = time.monotonic() + READ_TIMEOUT_S
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: partitions {sorted(left)} not read to their end")
            for message in consumer.consume(2000, timeout=0.5):
                if message.error() is not None:
                    continue
                p, offset = message.partition(), message.offset()
                if p is None:  # a consumed record always has one; the stub allows None
                    continue
                records.append((p, message.key() or b"", message.value() or b""))
                if offset is not None and offset + 1 >= ends[p]:
                    left.discard(p)
            for p in list(left):  # transaction markers at the end leave no message to see
                position = consumer.position([TopicPartition(topic, p)])[0].offset
                if position >= ends[p]:
                    left.discard(p)
        return records
    finally:
        consumer.close()


def create_topics(admin: AdminClient, names: Sequence[str], partitions: int) -> None:
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names], operation_timeout=60
    )
    for future in futures.values():
        future.result(timeout=90)


def delete_topics(admin: AdminClient, names: Sequence[str]) -> None:
    for future in admin.delete_topics(list(names), operation_timeout=30).values():
        try:
            future.result(timeout=60)
        except Exception as error:
            print(f"warning: could not delete a topic: {error}")


def produce_queued(producer: Producer, topic: str, key: bytes, value: bytes, partition: int = -1) -> None:
    """`producer.produce`, waiting while librdkafka's queue is full (100,000 records queued)."""
    while True:
        try:
            producer.produce(topic, key=key, value=value, partition=partition)
            return
        except BufferError:  # let deliveries drain it
            producer.poll(0.1)
