"""Hostile trace headers, generated (hypothesis): reading them never raises, and what is
accepted goes out again as the same W3C context (helper-21's review of issue 20).

A producer chooses its records' headers freely; the processor reads them for every
input before folding it (outside `step`'s per-input guard), so a header that made
`parent_context` raise would stop the partition. What it accepts, it writes back on the
records the input causes: that must be a context OpenTelemetry itself keeps unchanged.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.trace import get_current_span

from torpor.streams.tracing import TRACEPARENT, TRACESTATE, context_headers, parent_context

GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_HEX = "0123456789abcdefABCDEF-xz \t\x00\xff"


def _mutated(base: str) -> st.SearchStrategy[str]:
    """`base` with a few characters replaced, inserted or deleted (near-misses of the grammar)."""
    return st.lists(st.tuples(st.integers(0, len(base)), st.sampled_from(["replace", "insert", "delete"]),
                              st.sampled_from(_HEX)), max_size=4).map(lambda edits: _edit(base, edits))


def _edit(text: str, edits: list[tuple[int, str, str]]) -> str:
    for where, how, char in edits:
        where = min(where, len(text))
        if how == "replace" and where < len(text):
            text = text[:where] + char + text[where + 1:]
        elif how == "insert":
            text = text[:where] + char + text[where:]
        elif how == "delete" and where < len(text):
            text = text[:where] + text[where + 1:]
    return text


_values = st.one_of(st.none(), st.binary(max_size=300), st.text(max_size=300),
                    _mutated(GOOD), _mutated(GOOD).map(lambda s: s.encode("latin-1")),
                    st.just(GOOD + "-extra"), st.just("01" + GOOD[2:] + "-more-fields"))
_states = st.one_of(st.none(), st.binary(max_size=600), st.text(max_size=600),
                    st.lists(st.tuples(st.from_regex(r"[a-z0-9@_*/-]{1,20}", fullmatch=True),
                                       st.from_regex(r"[\x20-\x7e]{1,20}", fullmatch=True)),
                             max_size=40).map(lambda pairs: ",".join(f"{k}={v}" for k, v in pairs)))
_headers = st.lists(st.one_of(st.tuples(st.just(TRACEPARENT), _values),
                              st.tuples(st.just(TRACESTATE), _states),
                              st.tuples(st.text(max_size=12), st.one_of(st.none(), st.binary(max_size=20)))),
                    max_size=6)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers=_headers)
def test_any_headers_give_a_context_or_none_and_what_is_kept_goes_out_unchanged(
        headers: list[tuple[str, str | bytes | None]]) -> None:
    logging.getLogger("opentelemetry").setLevel(logging.ERROR)
    context = parent_context(headers)
    if context is None:
        return
    span = get_current_span(context).get_span_context()
    assert span.is_valid and span.is_remote
    out = dict(context_headers(span))
    again = parent_context(list(out.items()))
    assert again is not None
    back = get_current_span(again).get_span_context()
    assert (back.trace_id, back.span_id, back.trace_flags) == (span.trace_id, span.span_id, span.trace_flags)
    assert back.trace_state == span.trace_state
    first = next(value for key, value in headers if key == TRACEPARENT)
    assert first is not None
    text = first if isinstance(first, str) else first.decode("ascii")
    assert out[TRACEPARENT].decode("ascii")[3:52] == text[3:52]  # the ids it read are the first header's


def test_a_tracestate_opentelemetry_would_refuse_is_never_passed_on(caplog: pytest.LogCaptureFixture) -> None:
    """Accepted members are ones OpenTelemetry's `TraceState` keeps: nothing it drops with a
    warning of its own per record (a log line per hostile record)."""
    caplog.set_level(logging.WARNING)
    refused = ("a=1,a=2", "A=1", "a= ", "a=b=c", "a=1\x7f", "@v=1", "a=" + "x" * 257,
               ",".join(f"k{i}=v" for i in range(33)))
    for state in refused:
        context = parent_context([(TRACEPARENT, GOOD), (TRACESTATE, state)])
        assert context is not None
        kept = get_current_span(context).get_span_context().trace_state
        assert kept is None or len(kept) == 0, (state, kept)
    kept = get_current_span(parent_context([(TRACEPARENT, GOOD), (TRACESTATE, "a=1 2,k@v=x")])
                            ).get_span_context().trace_state  # spaces inside a value, a vendor key: W3C
    assert kept is not None and dict(kept) == {"a": "1 2", "k@v": "x"}
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]
