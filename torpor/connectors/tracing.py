"""Spans of a connector: one per dispatch it takes, from the dispatch to its final answer.

Contract (docs/traces.md). Built by `ConnectorRuntime` only when it is handed a `Tracing`
(the command line's `--traces`); otherwise nothing here is imported.

- `EffectTraces.taken(dispatch, headers)` starts `effect <tool>` (kind CONSUMER) under the
  trace context of the dispatch's `outbox` record (the processor's `dispatch <tool>`
  span). An `invoke` stays open until its final answer; a cancel, a close or an approval
  decision is a span that ends at once.
- `EffectTraces.headers_for(record, final)` is the trace context for an input the
  connector produces for a dispatch it took (a result, an event, a timer, an approval
  request): the effect span's. A final answer ends the span (an error result marks it).

An answer re-sent after a restart (the journal's `done`, not delivered) has no span in
this process: it goes without trace headers, and its fold starts a new trace. Open spans
are bounded (`OPEN_EFFECTS_KEPT`): past it the oldest is ended as `torpor.effect.unfinished`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final

from opentelemetry.trace import Span, SpanKind, StatusCode

from torpor.connectors.inprocess import INVOKE
from torpor.schemas.records import ApprovalRequest, Dispatch, Input, TimerFired, ToolEvent, ToolResult
from torpor.streams.tracing import Headers, RawHeaders, Tracing

# Effects whose span is held open (timers and subscriptions wait long): the rest are ended.
OPEN_EFFECTS_KEPT: Final = 10_000


class EffectTraces:
    """The effect spans of one connector runtime (module docstring). Thread-safe."""

    def __init__(self, tracing: Tracing, kept: int = OPEN_EFFECTS_KEPT) -> None:
        self.tracing = tracing
        self._kept = kept
        self._open: OrderedDict[str, Span] = OrderedDict()
        self._lock = threading.Lock()

    def taken(self, dispatch: Dispatch, headers: RawHeaders) -> None:
        """`dispatch` was read from the outbox with `headers`: its span starts."""
        parent = self.tracing.parent(headers)
        span = self.tracing.start(f"effect {dispatch.tool}", parent, SpanKind.CONSUMER, {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "torpor.thread_id": dispatch.thread_id,
            "torpor.request_id": dispatch.request_id,
            "torpor.call_id": dispatch.call_id,
            "torpor.dispatch.kind": dispatch.kind,
            "torpor.dispatch.attempt": dispatch.attempt,
        })
        if dispatch.kind != INVOKE:
            span.end()
            return
        with self._lock:
            replaced = self._open.pop(dispatch.request_id, None)  # a redelivery: the new one counts
            self._open[dispatch.request_id] = span
            evicted = [self._open.popitem(last=False)[1] for _ in range(len(self._open) - self._kept)]
        for old in ([replaced] if replaced is not None else []) + evicted:
            old.set_attribute("torpor.effect.unfinished", True)
            old.end()

    def headers_for(self, record: Input, final: str | None) -> Headers:
        """The trace headers for `record`, produced for a dispatch (`final`: its final answer)."""
        request_id = final or _request_of(record)
        if request_id is None:
            return ()
        with self._lock:
            span = self._open.pop(request_id, None) if final is not None else self._open.get(request_id)
        if span is None:
            return ()
        headers = self.tracing.headers(span)
        if final is not None:
            body = record.body
            if isinstance(body, ToolResult) and not body.ok:
                span.set_status(StatusCode.ERROR, "the tool answered with an error")
            span.end()
        return headers

    def close(self) -> None:
        """End every span still open (the runtime stops; the journal keeps the effects)."""
        with self._lock:
            spans, self._open = list(self._open.values()), OrderedDict()
        for span in spans:
            span.set_attribute("torpor.effect.unfinished", True)
            span.end()


def _request_of(record: Input) -> str | None:
    body = record.body
    if isinstance(body, ToolResult | ToolEvent | TimerFired | ApprovalRequest):
        return body.request_id
    return None
