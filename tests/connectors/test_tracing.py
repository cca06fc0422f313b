"""A connector's effect spans (no broker): from the dispatch's headers to its final answer."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, get_current_span

from torpor.connectors.tracing import EffectTraces
from torpor.schemas.records import Capability, Dispatch, Input, TextBlock, ToolEvent, ToolResult
from torpor.streams.tracing import TRACEPARENT, Tracing, parent_context

PARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def traces(exporter: InMemorySpanExporter) -> EffectTraces:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return EffectTraces(Tracing(provider), kept=2)


def _dispatch(request_id: str, kind: str = "invoke") -> Dispatch:
    return Dispatch(request_id=request_id, thread_id="t-1", call_id=f"c-{request_id}", tool="echo",
                    arguments="{}", capability=Capability("test", ("echo",), (), None), attempt=1,
                    created_at=1, deadline=None, kind=kind)


def _answer(request_id: str, body: ToolResult | ToolEvent) -> Input:
    return Input(message_id=f"m-{request_id}", thread_id="t-1", created_at=2, source="connector:echo",
                 expires_at=None, key_id=None, signature=None, body=body)


def _result(request_id: str, ok: bool = True) -> Input:
    return _answer(request_id, ToolResult(f"c-{request_id}", request_id, ok, (TextBlock("x"),), False))


def test_an_effect_span_runs_from_the_dispatch_to_its_answer_under_the_dispatch_span(
    traces: EffectTraces, exporter: InMemorySpanExporter,
) -> None:
    traces.taken(_dispatch("r1"), [(TRACEPARENT, PARENT)])
    assert exporter.get_finished_spans() == ()  # open while the tool works
    event = _answer("r1", ToolEvent("c-r1", "r1", 1, False, False, (TextBlock("e"),)))
    assert [k for k, _ in traces.headers_for(event, None)] == [TRACEPARENT]
    headers = traces.headers_for(_result("r1"), "r1")
    (span,) = exporter.get_finished_spans()
    assert span.name == "effect echo"
    assert span.parent is not None and span.parent.span_id == 0xb7ad6b7169203331
    context = parent_context(headers)  # the result carries the effect span's context
    assert context is not None
    assert get_current_span(context).get_span_context().span_id == span.context.span_id
    assert traces.headers_for(_result("r1"), "r1") == ()  # answered: nothing open any more


def test_an_error_answer_marks_the_span_and_other_kinds_end_at_once(
    traces: EffectTraces, exporter: InMemorySpanExporter,
) -> None:
    traces.taken(_dispatch("r2"), None)
    traces.taken(_dispatch("r2", kind="cancel"), None)
    traces.headers_for(_result("r2", ok=False), "r2")
    cancel, effect = exporter.get_finished_spans()
    assert cancel.attributes is not None and cancel.attributes["torpor.dispatch.kind"] == "cancel"
    assert effect.status.status_code is StatusCode.ERROR and effect.parent is None


def test_open_spans_are_bounded_and_closed_at_the_end(
    traces: EffectTraces, exporter: InMemorySpanExporter,
) -> None:
    for request_id in ("a", "b", "c"):
        traces.taken(_dispatch(request_id), None)
    (evicted,) = exporter.get_finished_spans()
    assert evicted.attributes is not None and evicted.attributes["torpor.dispatch.kind"] == "invoke"
    assert evicted.attributes["torpor.request_id"] == "a" and evicted.attributes["torpor.effect.unfinished"]
    assert traces.headers_for(_result("a"), "a") == ()  # an answer after eviction goes without a trace
    traces.close()
    assert len(exporter.get_finished_spans()) == 3
