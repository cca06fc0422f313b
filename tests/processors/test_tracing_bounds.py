"""A fold span's attributes are bounded whatever the input says (helper-21's review of issue 20).

The processor starts an input's span before `step`'s door checks its ids, and copies its
thread id, message id and source into the span. Those are a writer's choice: up to the
input's whole size (256 KiB) each, where a wire id is at most 256 characters. A span
holds its attributes until it is exported, and a batch processor keeps up to 2,048 spans
while its collector is slow or away: hostile inputs must not make that half a gigabyte.
"""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.processors.fold_scenarios import user
from torpor.processors.tracing import FoldTraces
from torpor.schemas.ids import MAX_ID_LENGTH
from torpor.schemas.records import Input
from torpor.streams.task import InputRecord
from torpor.streams.tracing import Tracing


def test_a_fold_span_keeps_no_attribute_longer_than_a_wire_id() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traces = FoldTraces(Tracing(provider), "outbox")
    huge = "x" * 200_000
    hostile = Input(message_id=huge, thread_id=huge, created_at=0, source="user:" + huge, expires_at=None,
                    key_id=None, signature=None, body=user("hi"))
    record = InputRecord("inputs", 0, 7, huge.encode(), b"", 0)
    traces.fold(record, hostile).end()
    [span] = exporter.get_finished_spans()
    assert span.attributes is not None
    longest = max(len(str(value)) for value in span.attributes.values())
    assert longest <= MAX_ID_LENGTH, {k: len(str(v)) for k, v in span.attributes.items()}
