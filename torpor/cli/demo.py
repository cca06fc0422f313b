"""`torpor demo`: the wire contract through a real broker, in one command.

Creates the topics (idempotently), produces a `CreateThread` and a `UserMessage` for a
fresh thread to `inputs` in one Kafka transaction, then reads them back with a
read_committed consumer from the partition Kafka's own partitioner chose, decodes them
with the shipped schemas and prints what it read. It exits non-zero with a one-line
cause if the broker does not answer or a record does not come back intact.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

import click
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from torpor.cli.settings import read_settings, settings_options
from torpor.schemas.codec import Codec
from torpor.schemas.errors import TorporError
from torpor.schemas.ids import derive_id
from torpor.schemas.records import (
    Budgets,
    Capability,
    CreateThread,
    Input,
    TextBlock,
    ThreadConfig,
    UserMessage,
)
from torpor.streams.admin import ensure_topics
from torpor.streams.clients import make_admin, make_consumer, make_producer
from torpor.streams.deadline import Deadline
from torpor.streams.partitioner import partition_for
from torpor.streams.topics import Topic, TopicNames

READ_BACK_SECONDS: Final = 30.0


def demo_inputs(thread_id: str, now_ms: int) -> tuple[Input, Input]:
    """The two inputs the demo writes: create a thread, then say something to it."""
    config = ThreadConfig(
        model="scripted",
        system_prompt="You are a patient agent.",
        tools=(),
        capability=Capability(tenant="demo", tools=(), scopes=(), expires_at=None),
        budgets=Budgets(max_turns=None, max_children=None, max_tool_retries=3, max_invalid_calls=3),
        parent=None,
        context_window=200_000,
        compaction_threshold=0.75,
        allow_implicit_create=False,
    )
    create = Input(
        message_id=derive_id(thread_id, "create"),
        thread_id=thread_id,
        created_at=now_ms,
        source="user:demo",
        expires_at=None,
        key_id=None,
        signature=None,
        body=CreateThread(config=config, inherited=(), initial=()),
    )
    hello = Input(
        message_id=derive_id(thread_id, "hello"),
        thread_id=thread_id,
        created_at=now_ms + 1,
        source="user:demo",
        expires_at=None,
        key_id=None,
        signature=None,
        body=UserMessage(content=(TextBlock("Wake me when the build is green."),)),
    )
    return create, hello


def _read_back(consumer: Consumer, topic: str, partition: int, start: int, count: int) -> list[bytes]:
    consumer.assign([TopicPartition(topic, partition, start)])
    deadline = Deadline.after(READ_BACK_SECONDS)
    values: list[bytes] = []
    while len(values) < count and not deadline.expired():
        message = consumer.poll(deadline.timeout_for_call(1.0))
        if message is None:
            continue
        if message.error():
            raise click.ClickException(f"reading {topic}[{partition}]: {message.error()}")
        value = message.value()
        assert value is not None
        values.append(value)
    if len(values) < count:
        raise click.ClickException(
            f"only {len(values)} of {count} records came back from {topic}[{partition}] "
            f"within {READ_BACK_SECONDS:.0f}s"
        )
    return values


@click.command()
@settings_options
def demo(config_file: Path | None, bootstrap: str | None) -> None:
    """Produce an Input to a real broker in a transaction and read it back."""
    settings = read_settings(config_file, bootstrap)
    names = TopicNames.for_prefix(settings.topics.prefix)
    try:
        ensured = ensure_topics(make_admin(settings), settings, Deadline.after(30.0))
        codec = Codec.from_url(settings.schema_registry.url)
        thread_id = f"demo-{time.time_ns():x}"
        create, hello = demo_inputs(thread_id, time.time_ns() // 1_000_000)
        inputs = names.of(Topic.INPUTS)

        producer = make_producer(settings, transactional_id=f"torpor-demo-{thread_id}")
        producer.init_transactions(30.0)
        delivered: list[tuple[int, int]] = []

        def on_delivery(error: object, message: Message) -> None:
            if error is None:
                delivered.append((message.partition() or 0, message.offset() or 0))

        producer.begin_transaction()
        for record in (create, hello):
            producer.produce(
                inputs,
                key=thread_id.encode(),
                value=codec.encode(inputs, record),
                on_delivery=on_delivery,
            )
        producer.commit_transaction(30.0)
        if len(delivered) != 2:
            raise click.ClickException(f"the broker acknowledged {len(delivered)} of 2 records")

        consumer = make_consumer(settings, group_id=f"torpor-demo-{thread_id}")
        partitions = len(consumer.list_topics(inputs, timeout=10.0).topics[inputs].partitions)
        partition = partition_for(thread_id.encode(), partitions)
        if {p for p, _ in delivered} != {partition}:
            raise click.ClickException(
                f"records landed on partitions {sorted({p for p, _ in delivered})}, but Kafka's "
                f"murmur2 partitioner puts {thread_id!r} on {partition}"
            )
        values = _read_back(consumer, inputs, partition, min(o for _, o in delivered), 2)
        consumer.close()
    except (TorporError, KafkaException) as error:
        raise click.ClickException(str(error)) from None

    decoded = [codec.decode(inputs, value, Input, partition=partition) for value in values]
    if decoded != [create, hello]:
        raise click.ClickException(f"the records read back differ from those written: {decoded!r}")
    click.echo(f"topics ready ({len(ensured.created)} created) with prefix {settings.topics.prefix!r}")
    for record in decoded:
        click.echo(
            f"{inputs}[{partition}] thread={record.thread_id} id={record.message_id} "
            f"body={type(record.body).__name__}"
        )
    click.echo(f"thread {thread_id}: 2 inputs written in one transaction and read back intact")
