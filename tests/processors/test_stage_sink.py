"""The model stage's sink on a real broker: what its producer holds stays bounded, and a
completion it could not deliver is said.

librdkafka keeps every message it sent until the report of its delivery is served. The
processor's loop never serves the stage producer's reports, so the sink serves them
itself every `SERVE_REPORTS_EVERY` sends; before it did, a worker held up to 100,000
delivered messages (~120 MiB) until a full queue made it flush them all at once.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Final

import pytest

from tests.conftest import TopicFactory
from tests.waiting import wait_until
from torpor.processors.processor import SERVE_REPORTS_EVERY, STAGE_LINGER_MS, KafkaStageSink
from torpor.schemas.codec import default_codec
from torpor.schemas.records import Completion, Input, ThreadEvent, Usage
from torpor.streams.clients import make_producer
from torpor.streams.config import KafkaSettings, Settings
from torpor.streams.topics import TopicNames

pytestmark = pytest.mark.kafka

ROUNDS_FIRST: Final = 10
# librdkafka's bound on what a producer holds (`queue.buffering.max.messages`, 100,000 by
# default) raised out of reach: at that bound a full queue makes the sink flush, which
# serves every report, and would hide a sink that never serves them otherwise.
QUEUE_BOUND: Final = 10_000_000


def _event(index: int) -> ThreadEvent:
    return ThreadEvent(event_id=f"event-{index}", thread_id=f"thread-{index % 7}", created_at=index,
                       kind="delta", ephemeral=True, seq=None, entry=None, text="x" * 200, data=None)


def test_the_stage_sink_frees_the_messages_the_broker_acknowledged(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topics = dataclasses.replace(TopicNames.for_prefix("unused."), events=topic_factory(partitions=2))
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap,
                          librdkafka_overrides=(("queue.buffering.max.messages", str(QUEUE_BOUND)),))
    producer = make_producer(Settings(kafka=kafka), linger_ms=STAGE_LINGER_MS)
    sink = KafkaStageSink(producer, topics, 2, default_codec())
    sent = 0

    def send_round() -> None:
        nonlocal sent
        for _ in range(SERVE_REPORTS_EVERY):
            sink.publish_event(_event(sent))
            sent += 1

    for _ in range(ROUNDS_FIRST):
        send_round()

    def held_is_bounded() -> int | None:
        # A round ends with a serve: what stays held is the messages not yet acknowledged
        # then (this round's, at most); unserved, every message sent would still be held.
        send_round()
        held = len(producer)
        return held if held <= 2 * SERVE_REPORTS_EVERY else None

    wait_until(held_is_bounded, timeout=60,
               message=f"the stage's producer still holds more than {2 * SERVE_REPORTS_EVERY} messages")
    assert producer.flush(30) == 0  # and nothing was lost on the way


def test_the_stage_sink_says_when_a_completion_was_not_delivered(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A topic the broker does not have (it creates none by itself): librdkafka gives up
    # on the record after its delivery timeout, shortened here.
    missing = f"test.missing.{uuid.uuid4().hex}"
    topics = dataclasses.replace(TopicNames.for_prefix("unused."), inputs=missing)
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap,
                          librdkafka_overrides=(("message.timeout.ms", "1000"),))
    producer = make_producer(Settings(kafka=kafka), linger_ms=STAGE_LINGER_MS)
    sink = KafkaStageSink(producer, topics, 2, default_codec())
    body = Completion(request_id="request-1", content=(), tool_calls=(), usage=Usage(0, 0, 0),
                      model="scripted:test", error=None)
    completion = Input(message_id="request-1", thread_id="thread-lost", created_at=1, source="processor",
                       expires_at=None, key_id=None, signature=None, body=body)
    with caplog.at_level(logging.WARNING, logger="torpor.processors.processor"):
        sink.publish_completion(completion)
        assert producer.flush(30) == 0  # served: the report of the failed delivery included
    said = [r for r in caplog.records if "a completion was not delivered" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert getattr(said[0], "thread_id", None) == "thread-lost"
