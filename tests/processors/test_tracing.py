"""Traces through a real broker: `torpor send`, the processor, the model stage and the echo
connector (hosted by the processor), each with `--traces console`, whose JSON span lines
are parsed here. One user message that makes a tool call must be one trace, with every
span under the one that caused it; hostile trace headers must fold like any input; and
with tracing off no record carries a trace header Torpor added.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterable
from typing import Any, Final

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.processors.test_processor import TORPOR, Deployment, _conversation, deployment
from tests.waiting import wait_until
from torpor.schemas.codec import encode_value
from torpor.schemas.records import TextBlock, UserMessage

pytestmark = pytest.mark.kafka

__all__ = ["deployment"]  # the fixture, shared with test_processor

ECHO: Final = "torpor.connectors.echo:EchoTool"
Span = dict[str, Any]


def _spans(stderr: str) -> list[Span]:
    """The spans a `--traces console` process wrote: one JSON object a line."""
    found = []
    for line in stderr.splitlines():
        if line.startswith("{") and '"context"' in line:
            found.append(json.loads(line))
    return found


def _headers(bootstrap: str, topic: str) -> list[tuple[bytes | None, list[tuple[str, bytes]]]]:
    """(key, headers) of every record of `topic` (read_uncommitted: every record written)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        found: list[tuple[bytes | None, list[tuple[str, bytes]]]] = []
        for partition in sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions):
            tp = TopicPartition(topic, partition)
            low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, low)])
            position = low
            while position < high:
                for message in consumer.consume(500, timeout=1.0):
                    assert message.error() is None, message.error()
                    found.append((message.key(), list(message.headers() or [])))  # type: ignore[arg-type]
                (current,) = consumer.position([tp])
                position = max(position, current.offset)
        return found
    finally:
        consumer.close()


def _trace_keys(records: Iterable[tuple[bytes | None, list[tuple[str, bytes]]]]) -> set[str]:
    return {k for _, headers in records for k, _ in headers if k in ("traceparent", "tracestate")}


def test_one_message_with_a_tool_call_is_one_trace_from_send_to_the_final_turn(
    deployment: Deployment,
) -> None:
    thread_id = f"traced-{uuid.uuid4().hex[:8]}"
    create, _ = _conversation(thread_id, "please ping")
    deployment.send(create)
    sent = deployment.run([TORPOR, "send", thread_id, "please ping", "--traces", "console"])
    assert sent.returncode == 0, sent.stderr[-3000:]
    # A hostile neighbour: its trace headers are garbage, huge and duplicated; it folds anyway.
    hostile_id = f"hostile-{uuid.uuid4().hex[:8]}"
    hostile_create, hostile_hello = _conversation(hostile_id, "hello")
    producer = Producer({"bootstrap.servers": deployment.bootstrap, "partitioner": "murmur2_random"})
    junk = [("traceparent", b"00-" + b"f" * 100_000), ("tracestate", b"=" * 100_000)] + \
        [("traceparent", b"garbage")] * 1000
    for record in (hostile_create, hostile_hello):
        producer.produce(deployment.topic("inputs"), key=hostile_id.encode(), value=encode_value(record),
                         headers=junk)
    assert producer.flush(30) == 0

    processed = deployment.run(deployment.processor_args("p0", "--until-idle", "--connector", ECHO,
                                                         "--traces", "console"), timeout=240)
    assert processed.returncode == 0, processed.stderr[-4000:]
    assert deployment.answers(thread_id) == ["Pinging.", "The echo said ping."]
    assert deployment.answers(hostile_id) == ["Hello to you."]
    assert processed.stderr.count("trace context was ignored") == 1  # one line, not one per record

    (send,) = _spans(sent.stderr)
    spans = _spans(processed.stderr)
    trace = send["context"]["trace_id"]
    ours = [s for s in spans if s["context"]["trace_id"] == trace]
    names = sorted(s["name"] for s in ours)
    assert names == sorted(["fold UserMessage", "model scripted", "fold Completion", "dispatch echo",
                            "effect echo", "fold ToolResult", "model scripted", "fold Completion"]), names
    by_id = {s["context"]["span_id"]: s for s in [send, *ours]}

    def parent(span: Span) -> str:
        found = by_id.get(span["parent_id"])
        assert found is not None, f"{span['name']} has a parent outside the trace"
        return str(found["name"])

    assert parent(_one(ours, "fold UserMessage")) == "send UserMessage"
    models = sorted((s for s in ours if s["name"] == "model scripted"), key=lambda s: s["start_time"])
    folds = sorted((s for s in ours if s["name"] == "fold Completion"), key=lambda s: s["start_time"])
    assert [parent(m) for m in models] == ["fold UserMessage", "fold ToolResult"]
    assert [by_id[f["parent_id"]] for f in folds] == models  # each completion under its model call
    assert parent(_one(ours, "dispatch echo")) == "fold Completion"
    assert by_id[_one(ours, "dispatch echo")["parent_id"]] is folds[0]
    assert parent(_one(ours, "effect echo")) == "dispatch echo"
    assert parent(_one(ours, "fold ToolResult")) == "effect echo"
    assert [m["attributes"]["torpor.tool_calls"] for m in models] == [1, 0]
    folded = _one(ours, "fold UserMessage")["attributes"]
    assert folded["torpor.thread_id"] == thread_id and folded["torpor.disposition"] == "applied"

    # The hostile inputs started traces of their own (no parent), and were applied.
    hostile = {s["name"]: s for s in spans if s["attributes"].get("torpor.thread_id") == hostile_id
               and s["name"].startswith("fold ")}
    assert sorted(hostile) == ["fold Completion", "fold CreateThread", "fold UserMessage"]
    assert [hostile[n]["parent_id"] for n in ("fold CreateThread", "fold UserMessage")] == [None, None]
    assert {s["attributes"]["torpor.disposition"] for s in hostile.values()} == {"applied"}

    # Headers are not part of an input: a replay of the log (no tracing) matches the live run.
    replay = deployment.run([TORPOR, "replay", "--no-progress"])
    assert replay.returncode == 0, replay.stdout + replay.stderr


def _one(spans: list[Span], name: str) -> Span:
    (found,) = [s for s in spans if s["name"] == name]
    return found


def test_with_tracing_off_no_record_carries_a_trace_header(deployment: Deployment) -> None:
    thread_id = f"untraced-{uuid.uuid4().hex[:8]}"
    create, _ = _conversation(thread_id, "please ping")
    deployment.send(create)
    sent = deployment.run([TORPOR, "send", thread_id, "please ping"])
    assert sent.returncode == 0, sent.stderr[-3000:]
    processed = deployment.run(deployment.processor_args("p0", "--until-idle", "--connector", ECHO),
                               timeout=240)
    assert processed.returncode == 0, processed.stderr[-4000:]
    assert deployment.answers(thread_id) == ["Pinging.", "The echo said ping."]
    for topic in ("inputs", "outbox", "receipts", "events"):
        assert _trace_keys(_headers(deployment.bootstrap, deployment.topic(topic))) == set(), topic
    user = [i for i in deployment.inputs() if isinstance(i.body, UserMessage)]
    assert [b.text for i in user for b in i.body.content if isinstance(b, TextBlock)] == ["please ping"]



def test_a_connector_process_continues_the_processor_s_trace(deployment: Deployment) -> None:
    thread_id = f"apart-{uuid.uuid4().hex[:8]}"
    create, _ = _conversation(thread_id, "please ping")
    deployment.send(create)
    processor = deployment.start(deployment.processor_args("p0", "--traces", "console"), "processor")
    echo = deployment.start([TORPOR, "connector", "run-echo", "--group", f"echo-{deployment.prefix}",
                             "--traces", "console"], "echo")
    sent = deployment.run([TORPOR, "send", thread_id, "please ping", "--traces", "console"])
    assert sent.returncode == 0, sent.stderr[-3000:]
    wait_until(lambda: "The echo said ping." in deployment.answers(thread_id), timeout=120,
               message=lambda: f"the final answer; processor log:\n{deployment.log('processor')[-3000:]}")
    for process in (processor, echo):
        process.send_signal(signal.SIGTERM)
    assert processor.wait(timeout=60) == 0, deployment.log("processor")[-3000:]
    assert echo.wait(timeout=60) == 0, deployment.log("echo")[-3000:]

    (send,) = _spans(sent.stderr)
    trace = send["context"]["trace_id"]
    folds = [s for s in _spans(deployment.log("processor")) if s["context"]["trace_id"] == trace]
    (effect,) = [s for s in _spans(deployment.log("echo")) if s["context"]["trace_id"] == trace]
    assert effect["name"] == "effect echo"
    assert effect["resource"]["attributes"]["service.name"] == "torpor-connector"
    assert _one(folds, "dispatch echo")["context"]["span_id"] == effect["parent_id"]
    assert _one(folds, "fold ToolResult")["parent_id"] == effect["context"]["span_id"]
