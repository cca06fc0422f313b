"""A traced `ThreadTask` folds exactly what an untraced one folds, without a broker.

Two processors (their Kafka clients built but never used) fold the same batch: one with
tracing (an in-memory exporter), one without. The store each ends with and the records
each produces are the same, but for the trace headers: tracing is in the shell around
`step`, never in the fold. The traced one makes a span per input under the trace context
of its record, and its records carry that span's context.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.processors.test_processor import _conversation
from torpor.processors.models.provider import (
    CompletionRequest,
    Finished,
    ModelInfo,
    ModelOutput,
    ScriptedModel,
    TextDelta,
)
from torpor.processors.processor import Processor, ProcessorConfig
from torpor.processors.tracing import FoldTraces, ModelTraces, TracedProvider, TracedSink
from torpor.schemas.codec import encode_value
from torpor.schemas.records import Completion, Input, TextBlock, ThreadEvent, Usage
from torpor.streams.config import KafkaSettings, Settings
from torpor.streams.task import InputRecord, OutputRecord, TaskOutput
from torpor.streams.tracing import TRACEPARENT, Headers, Tracing

PARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _fold(root: Path, tracing: Tracing | None) -> tuple[TaskOutput, dict[bytes, bytes]]:
    settings = Settings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"))  # nothing listens there
    processor = Processor(settings, ProcessorConfig(instance="p0", store_dir=root), ScriptedModel([]),
                          inputs_partitions=1, tracing=tracing)
    try:
        topic = processor.topics.inputs
        create, hello = (encode_value(i) for i in _conversation("t-1", "hello"))
        records = [
            InputRecord(topic, 0, 0, b"t-1", create, 1_000),
            InputRecord(topic, 0, 1, b"t-1", hello, 1_000, headers=(("x", b"y"), (TRACEPARENT, PARENT))),
            InputRecord(topic, 0, 2, b"t-1", b"poison", 1_000, headers=((TRACEPARENT, b"\xff" * 100_000),)),
        ]
        task = processor._open_task(0)
        output = task.process(records)
        store: dict[bytes, bytes] = {}
        for key, value in output.changes:
            if value is None:
                store.pop(key, None)
            else:
                store[key] = value
        task.abort()
        task.close()
        return output, store
    finally:
        processor.stages.stop()


def _by_topic(records: tuple[OutputRecord, ...]) -> dict[str, list[OutputRecord]]:
    """Each topic's records in order, trace headers left out. Order within a topic is what
    counts: one transaction makes every topic visible at once."""
    found: dict[str, list[OutputRecord]] = {}
    for record in records:
        found.setdefault(record.topic, []).append(OutputRecord(
            record.topic, record.key, record.value, record.partition,
            tuple(h for h in record.headers if h[0] not in ("traceparent", "tracestate"))))
    return found


def test_a_traced_task_folds_what_an_untraced_one_folds_and_spans_each_input(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traced, traced_store = _fold(tmp_path / "traced", Tracing(provider))
    plain, plain_store = _fold(tmp_path / "plain", None)

    assert traced_store == plain_store
    assert _by_topic(traced.records) == _by_topic(plain.records)
    assert not [h for r in plain.records for h in r.headers if h[0] == TRACEPARENT]

    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert sorted(spans) == ["fold CreateThread", "fold UserMessage", "fold undecodable"]
    hello = spans["fold UserMessage"]
    assert hello.parent is not None and hello.parent.span_id == 0xb7ad6b7169203331
    assert hello.context.trace_id == 0x0af7651916cd43dd8448eb211c80319c
    assert hello.attributes is not None and hello.attributes["torpor.disposition"] == "applied"
    assert spans["fold CreateThread"].parent is None  # no header: a trace of its own
    assert spans["fold undecodable"].parent is None  # a hostile header: ignored
    carried = {h[1] for r in traced.records for h in r.headers if h[0] == TRACEPARENT}
    assert f"00-{hello.context.trace_id:032x}-{hello.context.span_id:016x}-01".encode() in carried


class _Answers:
    """A provider that finishes at once (the contract: deltas, then one `Finished`)."""

    def models(self) -> tuple[ModelInfo, ...]:
        return ()

    async def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        yield TextDelta("hi")
        yield Finished((TextBlock("hi"),), (), Usage(3, 1, 4), "m1")


class _Sink:
    def __init__(self) -> None:
        self.published: list[tuple[Input, Headers]] = []

    def publish_event(self, event: ThreadEvent) -> None:
        pass

    def publish_completion(self, completion: Input, headers: Headers = ()) -> None:
        self.published.append((completion, headers))


def test_a_model_call_is_a_span_under_its_request_and_its_completion_carries_it() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traces = FoldTraces(Tracing(provider), "outbox")
    traces.models.requested("req-1", ((TRACEPARENT, PARENT),))
    model, sink = TracedProvider(_Answers(), traces), _Sink()
    request = CompletionRequest("req-1", "t-1", "scripted", "", (), (), None)

    async def call() -> list[ModelOutput]:
        return [output async for output in model.complete(request)]

    outputs = asyncio.run(call())
    assert isinstance(outputs[-1], Finished)
    asyncio.run(call())  # a retry: a sibling under the same request, not a child of the first
    first, span = exporter.get_finished_spans()
    assert first.parent == span.parent
    assert span.name == "model scripted"
    assert span.parent is not None and span.parent.span_id == 0xb7ad6b7169203331
    assert span.attributes is not None and span.attributes["gen_ai.usage.output_tokens"] == 1
    completion = Input("req-1", "t-1", 1, "processor", None, None, None,
                       Completion("req-1", (), (), Usage(0, 0, 0), "m1", None))
    TracedSink(sink, traces).publish_completion(completion)
    ((_, headers),) = sink.published
    expected = f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01".encode()
    assert headers == ((TRACEPARENT, expected),)
    assert traces.models.published("req-1") == ()  # published: forgotten


def test_model_traces_keep_only_the_newest_requests() -> None:
    kept = ModelTraces(kept=2)
    for request_id in ("a", "b", "c"):
        kept.requested(request_id, (("traceparent", request_id.encode()),))
    assert [kept.requested_by(r) != () for r in ("a", "b", "c")] == [False, True, True]
    kept.called("c", (("traceparent", b"call"),))
    assert kept.requested_by("c") == (("traceparent", b"c"),)
    assert kept.published("c") == (("traceparent", b"call"),)
    assert kept.published("b") == (("traceparent", b"b"),)  # never called: the fold span's
