"""W3C trace context in Kafka record headers, and the spans Torpor's shell makes (docs/traces.md).

Contract. `Tracing(tracer_provider)` is what the command line builds when `--traces` is
on, and what the shell (processor, model stage, connector runtime, `torpor send`) is
handed; with tracing off it is None and nothing here is imported (this module needs the
optional extra `otel`).

- `Tracing.parent(headers)` reads a record's `traceparent` and `tracestate` headers into
  the context a span continues. A header that is not well-formed is ignored (the span
  starts a new trace): more than `TRACEPARENT_MAX_BYTES` or `TRACESTATE_MAX_BYTES`, not
  ASCII, not the W3C grammar. The first of duplicated headers counts. Checks are bounded
  by those sizes, so no header can slow a partition, and an ignored one costs at most
  one log line per process (`_ignored`), never one per record.
- `Tracing.start(name, parent, kind, attributes)` starts a span (not made current: the
  shell runs on several threads and an asyncio loop, so contexts are passed explicitly).
- `Tracing.headers(span)` is the span's context as record headers, for the records it causes.

Headers are not part of an input's signed or hashed bytes (`torpor.schemas.signing` covers
the Avro value only; history entries hold the decoded input), so a trace header changes
no receipt, no hash chain and no replay.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanContext, SpanKind, TraceFlags, TraceState

log = logging.getLogger(__name__)

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
# Version 00 is 55 characters; a later version may append fields (W3C: parse the first four).
TRACEPARENT_MAX_BYTES: Final = 256
# W3C: vendors should propagate at least 512 characters; a longer one may be dropped whole.
TRACESTATE_MAX_BYTES: Final = 512
TRACESTATE_MAX_MEMBERS: Final = 32

Headers = tuple[tuple[str, bytes], ...]
"""Record headers as `OutputRecord` carries them (and confluent-kafka accepts them)."""
RawHeaders = Iterable[tuple[str, str | bytes | None]] | None
"""Record headers as a consumed message has them: None when there are none."""

_TRACEPARENT_RE: Final = re.compile(
    r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[\x21-\x7e]*)?")
_KEY: Final = r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
_VALUE: Final = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER_RE: Final = re.compile(rf"[ \t]*({_KEY})=({_VALUE})[ \t]*")


class Tracing:
    """The shell's tracer and the W3C header codec (module docstring)."""

    def __init__(self, provider: trace.TracerProvider, name: str = "torpor") -> None:
        self._tracer = provider.get_tracer(name)
        self.provider = provider

    def parent(self, headers: RawHeaders) -> Context | None:
        """The trace context `headers` carry, or None (no header, or one ignored)."""
        return parent_context(headers)

    def start(self, name: str, parent: Context | None, kind: SpanKind = SpanKind.INTERNAL,
              attributes: Mapping[str, str | int | bool] | None = None) -> Span:
        """A started span under `parent` (None: a new trace); the caller ends it."""
        return self._tracer.start_span(name, context=parent if parent is not None else Context(),
                                       kind=kind, attributes=attributes)

    def headers(self, span: Span) -> Headers:
        """`span`'s context as `traceparent` (and `tracestate`) record headers."""
        return context_headers(span.get_span_context())

    @staticmethod
    def under(span: Span) -> Context:
        """The context of a child of `span`."""
        return trace.set_span_in_context(span, Context())


def context_headers(context: SpanContext) -> Headers:
    """`context` as W3C record headers (none for an invalid context)."""
    if not context.is_valid:
        return ()
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    if context.trace_state:
        return ((TRACEPARENT, parent.encode("ascii")),
                (TRACESTATE, context.trace_state.to_header().encode("ascii")))
    return ((TRACEPARENT, parent.encode("ascii")),)


def parent_context(headers: RawHeaders) -> Context | None:
    """The remote span context of `headers`' first `traceparent` (and `tracestate`), or None."""
    if not headers:
        return None
    parent: str | bytes | None = None
    state: str | bytes | None = None
    for key, value in headers:
        if key == TRACEPARENT and parent is None:
            parent = value if value is not None else b""
        elif key == TRACESTATE and state is None:
            state = value if value is not None else b""
    if parent is None:
        return None
    context = _span_context(parent, state)
    if context is None:
        return None
    return trace.set_span_in_context(trace.NonRecordingSpan(context), Context())


def _span_context(parent: str | bytes, state: str | bytes | None) -> SpanContext | None:
    if len(parent) > TRACEPARENT_MAX_BYTES:
        _ignored(f"a traceparent of {len(parent)} bytes (at most {TRACEPARENT_MAX_BYTES})")
        return None
    match = _TRACEPARENT_RE.fullmatch(_text(parent))
    if match is None:
        _ignored("a traceparent that is not version-trace_id-span_id-flags in lower-case hex")
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == "0" * 32 or span_id == "0" * 16:
        _ignored("a traceparent with a forbidden version, extra fields or a zero id")
        return None
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                       trace_flags=TraceFlags(int(flags, 16)), trace_state=_trace_state(state))


def _trace_state(state: str | bytes | None) -> TraceState | None:
    """`state` parsed, or None (absent or not well-formed: dropped whole, the parent kept)."""
    if not state:
        return None
    if len(state) > TRACESTATE_MAX_BYTES:
        _ignored(f"a tracestate of {len(state)} bytes (at most {TRACESTATE_MAX_BYTES})")
        return None
    text = _text(state)
    pairs: list[tuple[str, str]] = []
    for member in text.split(","):
        if not member.strip(" \t"):
            continue  # W3C: empty list members are allowed
        match = _MEMBER_RE.fullmatch(member)
        if match is None or len(pairs) == TRACESTATE_MAX_MEMBERS or any(k == match[1] for k, _ in pairs):
            _ignored("a tracestate that is not a W3C list of at most 32 distinct key=value members")
            return None
        pairs.append((match[1], match[2]))
    return TraceState(pairs)


def _text(value: str | bytes) -> str:
    """`value` as text; a non-ASCII byte becomes U+FFFD, which no W3C pattern accepts."""
    return value if isinstance(value, str) else value.decode("ascii", errors="replace")


_warned = threading.Event()


def _ignored(why: str) -> None:
    """Log the first ignored header of the process; the rest quietly (a hostile producer
    could otherwise write a log line per record)."""
    if _warned.is_set():
        log.debug("trace context ignored: %s", why)
        return
    _warned.set()
    log.warning("a record's trace context was ignored (its span starts a new trace): %s; "
                "later ones are ignored without a log line", why)
