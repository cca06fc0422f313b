"""W3C trace context in record headers: inject, extract, and what hostile headers do (no broker)."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, TraceState, get_current_span

from torpor.streams import tracing
from torpor.streams.tracing import TRACEPARENT, TRACESTATE, Tracing, context_headers, parent_context

GOOD = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def traced() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider), exporter


@pytest.fixture(autouse=True)
def fresh_warning() -> None:
    tracing._warned.clear()  # each test sees the process's first ignored header again


def _remote(headers: tracing.RawHeaders) -> tuple[int, int, TraceState | None] | None:
    context = parent_context(headers)
    if context is None:
        return None
    span = get_current_span(context).get_span_context()
    return span.trace_id, span.span_id, span.trace_state


Traced = tuple[Tracing, InMemorySpanExporter]


def test_a_span_s_headers_continue_its_trace_in_the_next_span(traced: Traced) -> None:
    t, exporter = traced
    first = t.start("send", None, SpanKind.PRODUCER)
    headers = t.headers(first)
    first.end()
    assert [k for k, _ in headers] == [TRACEPARENT]
    second = t.start("fold", t.parent(headers), SpanKind.CONSUMER)
    second.end()
    sent, folded = exporter.get_finished_spans()
    assert folded.context.trace_id == sent.context.trace_id
    assert folded.parent is not None and folded.parent.span_id == sent.context.span_id
    assert folded.parent.is_remote


def test_a_traceparent_and_tracestate_are_read_as_w3c_says() -> None:
    state = b"congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"
    found = _remote([("other", b"x"), (TRACEPARENT, GOOD), (TRACESTATE, state)])
    assert found is not None
    trace_id, span_id, parsed = found
    assert (trace_id, span_id) == (0x0af7651916cd43dd8448eb211c80319c, 0xb7ad6b7169203331)
    assert parsed is not None and dict(parsed) == {"congo": "t61rcWkgMzE", "rojo": "00f067aa0ba902b7"}
    assert context_headers(get_current_span(parent_context([(TRACEPARENT, GOOD)])).get_span_context()) == (
        (TRACEPARENT, GOOD),)


def test_no_headers_or_no_traceparent_mean_no_parent() -> None:
    assert parent_context(None) is None
    assert parent_context(()) is None
    assert parent_context([(TRACESTATE, b"a=b"), ("x", None)]) is None


@pytest.mark.parametrize("value", [
    b"", b"garbage", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",  # no flags
    b"00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  # upper case
    b"00-00000000000000000000000000000000-b7ad6b7169203331-01",  # zero trace id
    b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # zero span id
    b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # forbidden version
    GOOD + b"-extra",  # version 00 has exactly four fields
    b"\xff\xfe" + GOOD, GOOD.replace(b"a", b"\xe4", 1), b"00-" + b"\x00" * 52,
    None,
])
def test_a_malformed_traceparent_is_ignored(value: bytes | None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        assert parent_context([(TRACEPARENT, value)]) is None


def test_a_later_version_may_carry_more_fields() -> None:
    assert _remote([(TRACEPARENT, b"01" + GOOD[2:] + b"-what-comes-next")]) is not None


@pytest.mark.parametrize("state", [
    b"x" * 600, b"=", b"UPPER=1", b"a=b,a=c", b"a=" + b"v" * 300, b"a=\xff",
    b",".join(b"k%d=v" % i for i in range(33)),
])
def test_a_malformed_tracestate_is_dropped_and_the_parent_kept(
    state: bytes, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG):
        found = _remote([(TRACEPARENT, GOOD), (TRACESTATE, state)])
    assert found is not None and not found[2]  # an empty trace state
    # Nothing malformed reached OpenTelemetry's own parser, which logs a line per bad member.
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]


def test_a_100_kb_header_is_ignored_quickly_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    huge = b"00-" + b"a" * 100_000
    with caplog.at_level(logging.INFO):
        for _ in range(1000):
            assert parent_context([(TRACEPARENT, huge), (TRACESTATE, huge)]) is None
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(lines) == 1 and "ignored" in lines[0].getMessage()


def test_many_duplicates_take_the_first_and_log_at_most_once(caplog: pytest.LogCaptureFixture) -> None:
    other = b"00-11111111111111111111111111111111-2222222222222222-01"
    headers = [(TRACEPARENT, GOOD)] + [(TRACEPARENT, other)] * 10_000 + [(TRACESTATE, b"a=1")] * 10_000
    found = _remote(headers)
    assert found is not None and found[0] == 0x0af7651916cd43dd8448eb211c80319c
    assert found[2] is not None and dict(found[2]) == {"a": "1"}
    junk = [(TRACEPARENT, b"junk")] * 10_000
    with caplog.at_level(logging.INFO):
        for _ in range(100):
            assert parent_context(junk) is None
    assert len([r for r in caplog.records if r.levelno >= logging.INFO]) == 1


def test_text_header_values_are_read_like_bytes() -> None:
    assert _remote([(TRACEPARENT, GOOD.decode())]) is not None
