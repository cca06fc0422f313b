"""Spans of the processor's shell: one per folded input, one per dispatch, one per model call.

Contract (docs/traces.md). Built by `Processor` only when it is handed a `Tracing` (the
command line's `--traces`); otherwise nothing here is imported and no record is touched.

- `FoldTraces.fold(record)` is a span around the `step` of one input (`fold <Body>`,
  kind CONSUMER), parented on the trace context of the input's record headers, with its
  thread, message id, partition, offset and, once folded, its receipt's disposition.
  `FoldTraces.carry(span, output, records)` puts the span's context on every record the
  input caused; each dispatch gets a child span of its own (`dispatch <tool>`, PRODUCER)
  whose context travels on its `outbox` record, for the connector to continue. The
  completion requests it made are remembered (`ModelTraces`), for the model stage.
- `TracedProvider` wraps the model provider: a span per attempt (`model <model>`,
  CLIENT) under the fold span of the input that requested it; `TracedSink` wraps the
  stage's sink and puts the last attempt's context on the `Completion` it publishes.

The fold never sees any of it: spans start and end in the shell around `step`, and
headers are not part of an input (its signature, its hash chain, its replay).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import Final, Protocol

from opentelemetry.trace import Span, SpanKind, StatusCode

from torpor.processors.models.provider import (
    CompletionRequest,
    Finished,
    ModelInfo,
    ModelOutput,
    ModelProvider,
)
from torpor.processors.step import StepOutput
from torpor.schemas.ids import MAX_ID_LENGTH
from torpor.schemas.records import APPLIED, DEFERRED, DUPLICATE, Input, ThreadEvent
from torpor.streams.task import InputRecord, OutputRecord
from torpor.streams.tracing import Headers, Tracing

FoldSpan = Span
"""The span of one input's fold (an OpenTelemetry span), named for the processor's type hints."""

# Completion requests whose trace context is kept for the model stage: a request the
# stage drops (the thread moved on) is never asked for, so the oldest are forgotten.
MODEL_TRACES_KEPT: Final = 10_000
# Dispositions that are not a failure of the input (every other one marks the span an error).
_FINE: Final = frozenset({APPLIED, DUPLICATE, DEFERRED})


def _cut(text: str) -> str:
    """`text` for a span attribute: at most a wire id's length. The fold span starts before
    `step`'s door refuses a longer id, and a span holds its attributes until exported."""
    return text if len(text) <= MAX_ID_LENGTH else text[:MAX_ID_LENGTH - 3] + "..."


class ModelTraces:
    """request id -> (the headers of the fold span that requested it, of its last model call).

    Written by the fold's thread, read by the stage's: a lock. Bounded (`MODEL_TRACES_KEPT`)."""

    def __init__(self, kept: int = MODEL_TRACES_KEPT) -> None:
        self._kept = kept
        self._headers: OrderedDict[str, tuple[Headers, Headers]] = OrderedDict()
        self._lock = threading.Lock()

    def requested(self, request_id: str, headers: Headers) -> None:
        """The fold span with `headers` requested `request_id`."""
        with self._lock:
            self._headers[request_id] = (headers, ())
            self._headers.move_to_end(request_id)
            while len(self._headers) > self._kept:
                self._headers.popitem(last=False)

    def requested_by(self, request_id: str) -> Headers:
        """The headers of the fold span that requested `request_id` (each attempt's parent)."""
        with self._lock:
            return self._headers.get(request_id, ((), ()))[0]

    def called(self, request_id: str, headers: Headers) -> None:
        """An attempt at `request_id` is the span with `headers` (the last attempt wins)."""
        with self._lock:
            found = self._headers.get(request_id)
            if found is not None:
                self._headers[request_id] = (found[0], headers)

    def published(self, request_id: str) -> Headers:
        """Forget `request_id`; return the headers its `Completion` carries: the last model
        call's, or the requesting fold span's if no call was made."""
        with self._lock:
            requested, called = self._headers.pop(request_id, ((), ()))
            return called or requested


class FoldTraces:
    """The per-input spans of one processor (module docstring)."""

    def __init__(self, tracing: Tracing, outbox: str) -> None:
        self.tracing = tracing
        self.models = ModelTraces()
        self._outbox = outbox

    def fold(self, record: InputRecord, input: Input) -> Span:
        """A started span for folding `input`, read from `record`; the caller ends it."""
        return self.tracing.start(f"fold {type(input.body).__name__}", self.tracing.parent(record.headers),
                                  SpanKind.CONSUMER, {
                                      "messaging.system": "kafka",
                                      "messaging.operation.type": "process",
                                      "messaging.destination.name": record.topic,
                                      "messaging.destination.partition.id": str(record.partition),
                                      "messaging.kafka.offset": record.offset,
                                      "torpor.thread_id": _cut(input.thread_id),
                                      "torpor.message_id": _cut(input.message_id),
                                      "torpor.source": _cut(input.source),
                                  })

    def parked(self, record: InputRecord, why: str) -> None:
        """A span for an input parked before folding (undecodable, too large)."""
        span = self.tracing.start("fold undecodable", self.tracing.parent(record.headers), SpanKind.CONSUMER,
                                  {"messaging.destination.partition.id": str(record.partition),
                                   "messaging.kafka.offset": record.offset, "torpor.disposition": "parked"})
        span.set_status(StatusCode.ERROR, why[:200])
        span.end()

    def carry(self, span: Span, output: StepOutput, records: Sequence[OutputRecord]) -> list[OutputRecord]:
        """`records` (what one input caused) with trace headers; `span` told the disposition."""
        if output.receipts:
            disposition = output.receipts[-1].disposition
            span.set_attribute("torpor.disposition", disposition)
            if disposition not in _FINE:
                span.set_status(StatusCode.ERROR, disposition)
        caused = self.tracing.headers(span)
        for request in output.completions:
            self.models.requested(request.request_id, caused)
        dispatches = iter(output.dispatches)
        carried: list[OutputRecord] = []
        for out in records:
            headers = caused
            if out.topic == self._outbox:
                dispatch = next(dispatches, None)
                if dispatch is None:  # one outbox record per dispatch (`OutputWriter`): never
                    carried.append(dataclasses.replace(out, headers=out.headers + headers))
                    continue
                child = self.tracing.start(f"dispatch {dispatch.tool}", self.tracing.under(span),
                                           SpanKind.PRODUCER, {
                                               "messaging.system": "kafka",
                                               "messaging.operation.type": "send",
                                               "messaging.destination.name": out.topic,
                                               "torpor.thread_id": dispatch.thread_id,
                                               "torpor.request_id": dispatch.request_id,
                                               "torpor.call_id": dispatch.call_id,
                                               "torpor.dispatch.kind": dispatch.kind,
                                               "torpor.dispatch.attempt": dispatch.attempt,
                                           })
                headers = self.tracing.headers(child)
                child.end()
            carried.append(dataclasses.replace(out, headers=out.headers + headers))
        return carried


class TracedProvider:
    """A `ModelProvider` whose every call is a span under the requesting input's fold span."""

    def __init__(self, inner: ModelProvider, traces: FoldTraces) -> None:
        self._inner = inner
        self._traces = traces

    def models(self) -> tuple[ModelInfo, ...]:
        return self._inner.models()

    async def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        tracing = self._traces.tracing
        parent = tracing.parent(self._traces.models.requested_by(request.request_id))
        span = tracing.start(f"model {request.model}", parent, SpanKind.CLIENT, {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": request.model,
            "torpor.thread_id": request.thread_id,
            "torpor.request_id": request.request_id,
        })
        # The completion this attempt publishes continues from here (the last attempt wins).
        self._traces.models.called(request.request_id, tracing.headers(span))
        try:
            async for output in self._inner.complete(request):
                if isinstance(output, Finished):
                    span.set_attribute("gen_ai.response.model", output.model)
                    span.set_attribute("gen_ai.usage.input_tokens", output.usage.input_tokens)
                    span.set_attribute("gen_ai.usage.output_tokens", output.usage.output_tokens)
                    span.set_attribute("torpor.tool_calls", len(output.tool_calls))
                yield output
        except BaseException as exc:
            span.set_status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:200])
            raise
        finally:
            span.end()


class HeaderSink(Protocol):
    """What `TracedSink` wraps: the stage's Kafka sink, which takes headers for a completion."""

    def publish_event(self, event: ThreadEvent) -> None: ...

    def publish_completion(self, completion: Input, headers: Headers = ()) -> None: ...


class TracedSink:
    """A `StageSink` that puts the model call's trace context on the `Completion` it publishes."""

    def __init__(self, inner: HeaderSink, traces: FoldTraces) -> None:
        self._inner = inner
        self._traces = traces

    def publish_event(self, event: ThreadEvent) -> None:
        self._inner.publish_event(event)

    def publish_completion(self, completion: Input) -> None:
        # Its message id is the request id.
        self._inner.publish_completion(completion, self._traces.models.published(completion.message_id))
