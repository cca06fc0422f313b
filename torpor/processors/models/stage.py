"""The model stage: runs committed completion requests beside the fold (DESIGN section 5).

Contract. `ModelStage.submit(request)` is called only after the checkpoint that made the
request has committed. The stage then, off the fold's path:

1. reads the thread's state and model-visible history (from the latest summary on, up to
   `request.history_len`) from the committed store, and drops the request if the thread
   no longer awaits it (answered, interrupted, stopped: the fold moved on);
2. calls the provider with the history, the system prompt and the tools (the thread's
   own plus `BUILTIN_TOOLS`), publishing its live text as ephemeral `delta` events:
   deltas that arrive within `StageConfig.delta_window_s` of the first one not yet
   published are coalesced into one event (their texts joined, in order), so an observer
   that concatenates the deltas' texts sees exactly the provider's text, and a fast
   stream costs one event, not one per chunk;
3. publishes the finished turn as a `Completion` input, `message_id == request_id`,
   source `processor`, so a second copy (a re-issue after a crash) is a duplicate. Its
   tool calls carry ids the fold can bind a result to and any provider can be sent back
   (`callids.carried_calls`): a provider's id that is not of `CARRIED_CALL_ID` (empty, over 40
   characters, characters other than letters, digits, `_` and `-`), or that another call
   of the turn, a call the thread holds or its history already has, is replaced by one
   derived from the request id.

Transient provider errors are retried with bounded exponential backoff (at least a rate
limit's `retry-after`, up to `max_retry_after_s`), each retry
announced by an ephemeral `completion_retried` event; when the attempts are spent, or on
a permanent error, the stage publishes an error `Completion`, which parks the thread
loudly. `resume()` re-issues the requests of threads still `awaiting_model`, from the
store's index, after a restart or a rebalance.

Why asyncio: a completion is a long, I/O-bound stream, and providers' clients are
async-native; one event loop holds hundreds of streams for the cost of a few tasks, an
`asyncio.Semaphore` bounds how many run at once, and `cancel()` (revoke, shutdown) is a
task cancellation rather than a thread that cannot be interrupted. Each request runs
once per process: a request id already in flight is not started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from torpor.processors.fold.builtins import BUILTIN_TOOLS
from torpor.processors.fold.effects import RequestCompletion
from torpor.processors.fold.state import Status, ThreadState
from torpor.processors.models.callids import carried_calls, held_call_ids
from torpor.processors.models.deltas import Deltas, DeltaWindows
from torpor.processors.models.provider import (
    CompletionRequest,
    Finished,
    ModelError,
    ModelProvider,
    PermanentModelError,
    TextDelta,
    TransientModelError,
)
from torpor.processors.store.kv import Store
from torpor.processors.store.tables import HistoryCache, awaiting_requests, load_state
from torpor.schemas.codec import encode_value
from torpor.schemas.frozen import fast_inits
from torpor.schemas.ids import derive_id
from torpor.schemas.records import (
    Completion,
    CompletionError,
    Input,
    ThreadEvent,
    Usage,
)
from torpor.streams.config import MAX_INPUT_BYTES_CEILING
from torpor.streams.logfields import log_fields

log = logging.getLogger(__name__)

SOURCE: Final = "processor"
# A completion is the processor's own input, bounded below the ceiling: room is left for
# the report or summary a child wraps its answer in (`step` refuses a larger loopback).
COMPLETION_MAX_BYTES: Final = MAX_INPUT_BYTES_CEILING - 16_384


@dataclass(frozen=True, slots=True)
class StageConfig:
    """How hard the stage works. Defaults suit one laptop and a hosted provider."""

    concurrency: int = 16  # provider calls in flight at once: providers rate-limit per key
    # Tries per request before an error Completion: 0.5 + 1 + 2 + 4 + 8 s of backoff, so a
    # provider's bad quarter of a minute does not park its threads.
    max_attempts: int = 6
    backoff_initial_s: float = 0.5  # doubled per retry
    backoff_max_s: float = 16.0
    # A rate limit's `retry-after` is waited for, up to this long: a provider asking for
    # more than two minutes is better served by parking loudly than by a hidden stall.
    max_retry_after_s: float = 120.0
    # Coalescing of live deltas: a person reading a tail cannot tell 50 ms apart, and a
    # provider streams a chunk every few ms. 0 publishes every delta as it comes.
    delta_window_s: float = 0.05
    # Decoded history entries kept for the next completion of the same threads
    # (`HistoryCache`, one per process): 500 busy threads of ~100 entries, ~45 MB. Busy
    # threads beyond it are served by re-reading (an LRU cycled through misses entirely).
    history_cache_entries: int = 49_152

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.max_attempts < 1:
            raise ValueError("the model stage needs concurrency >= 1 and max_attempts >= 1")
        if not 0 <= self.backoff_initial_s <= self.backoff_max_s or self.max_retry_after_s < 0:
            raise ValueError("backoff must satisfy 0 <= initial <= max, and max_retry_after_s >= 0")
        if self.delta_window_s < 0 or self.history_cache_entries < 0:
            raise ValueError("delta_window_s and history_cache_entries must not be negative")

    def backoff(self, retry: int, hint_s: float | None = None) -> float:
        """Seconds to wait before retry number `retry` (1-based), at least the provider's hint."""
        backoff = float(min(self.backoff_max_s, self.backoff_initial_s * 2 ** (retry - 1)))
        return backoff if hint_s is None else max(backoff, min(hint_s, self.max_retry_after_s))


class StageSink(Protocol):
    """Where the stage's output goes: local mode's log, or the Kafka producer."""

    def publish_event(self, event: ThreadEvent) -> None:
        """An ephemeral event (deltas, retries), on the `events` topic."""
        ...

    def publish_completion(self, completion: Input) -> None:
        """The finished (or failed) completion, on the `inputs` topic."""
        ...


class CompletionObserver(Protocol):
    """Told of each completion the stage published (the processor's metrics): the request's
    model string, how long its provider calls took (every attempt and backoff, not the wait
    for a free slot), and the `Completion` body (its usage, its error). Called on the
    stage's thread; must be quick and must not raise."""

    def completion_published(self, model: str, seconds: float, completion: Completion) -> None: ...


class ModelStage:
    """Runs completion requests against `provider`; see the module docstring."""

    def __init__(
        self,
        store: Store,
        provider: ModelProvider,
        sink: StageSink,
        clock: Callable[[], int],
        config: StageConfig | None = None,
        histories: HistoryCache | None = None,
        observer: CompletionObserver | None = None,
    ) -> None:
        self._observer = observer
        self._store = store
        self._provider = provider
        self._sink = sink
        self._clock = clock  # ms since the epoch: stamps the records the stage produces
        self.config = config or StageConfig()
        self._gate = asyncio.Semaphore(self.config.concurrency)
        self._windows = DeltaWindows(self.config.delta_window_s)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # The stages of one process share one cache (`histories`), so its bound is the
        # process's, not the partition's: a thread id lives in one partition, and the
        # cache checks every prefix against the hash chain anyway.
        if histories is None:
            histories = HistoryCache(self.config.history_cache_entries)
        self._histories = histories

    def submit(self, request: RequestCompletion) -> bool:
        """Start `request` (committed) unless it is already in flight; True if started."""
        if request.request_id in self._tasks:
            return False
        task = asyncio.get_running_loop().create_task(self._run(request), name=f"model:{request.request_id}")
        self._tasks[request.request_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(request.request_id, None))
        return True

    def resume(self) -> int:
        """Re-issue the requests of every thread still awaiting the model; return how many."""
        started = 0
        for request in list(awaiting_requests(self._store)):
            state = load_state(self._store, request.thread_id)
            if state is not None and state.pending_request == request.request_id and self.submit(request):
                started += 1
        return started

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def wait_idle(self) -> None:
        """Wait until every submitted request has published its completion."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def cancel(self) -> None:
        """Cancel every call in flight (revoke, shutdown): `resume` re-issues them later."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, request: RequestCompletion) -> None:
        # This task's context: whatever the provider's adapter logs names the thread and request.
        with log_fields(thread_id=request.thread_id, request_id=request.request_id):
            await self._run_request(request)

    async def _run_request(self, request: RequestCompletion) -> None:
        where = {"thread_id": request.thread_id, "message_id": request.request_id}
        found = self._prepare(request)
        if found is None:
            log.info("completion request dropped: the thread no longer awaits it", extra=where)
            return
        prepared, state, history_ids = found
        async with self._gate:
            started = time.monotonic()
            completion = await self._attempts(prepared, state, history_ids)
            took = time.monotonic() - started
        self._sink.publish_completion(completion)
        body = completion.body
        failed = isinstance(body, Completion) and body.error is not None
        if self._observer is not None and isinstance(body, Completion):
            self._observer.completion_published(prepared.model, took, body)
        log.log(logging.WARNING if failed else logging.DEBUG, "completion published", extra=where)

    def _prepare(self, request: RequestCompletion,
                 ) -> tuple[CompletionRequest, ThreadState, Mapping[str, int] | None] | None:
        """The provider's request, the thread's state it was made from, and the call ids of its
        history if the history cache holds them (`HistoryCache.call_ids`)."""
        state = load_state(self._store, request.thread_id)
        if state is None or state.status is not Status.AWAITING_MODEL:
            return None
        if state.pending_request != request.request_id:
            return None
        history = self._histories.visible(self._store, state, request.history_len)
        return CompletionRequest(
            request_id=request.request_id,
            thread_id=request.thread_id,
            model=request.model,
            system_prompt=state.config.system_prompt,
            history=history,
            tools=state.config.tools + BUILTIN_TOOLS,
            parent=state.config.parent,
        ), state, self._histories.call_ids(request.thread_id, history)

    async def _attempts(self, request: CompletionRequest, state: ThreadState,
                        history_ids: Mapping[str, int] | None) -> Input:
        last: ModelError | None = None
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                finished = await self._once(request, attempt)
            except TransientModelError as exc:
                last = exc
                if attempt == self.config.max_attempts:
                    break
                delay = self.config.backoff(attempt, exc.retry_after_s)
                self._retried(request, attempt, exc, delay)
                await asyncio.sleep(delay)
                continue
            except ModelError as exc:
                last = exc
                break
            except Exception as exc:  # a provider bug must not lose the request: fail it loudly
                last = ModelError(f"{type(exc).__name__}: {exc}")
                log.exception("provider raised an unexpected error", extra={"thread_id": request.thread_id})
                break
            if finished.tool_calls:
                taken = held_call_ids(state, request.history, history_ids)
                calls = carried_calls(request.request_id, finished.tool_calls, taken)
                if calls is not finished.tool_calls:
                    finished = dataclasses.replace(finished, tool_calls=calls)
            completion = self._completion(request, finished, None)
            problem = _size_problem(finished, completion)
            if problem is None:
                return completion
            last = PermanentModelError(problem)  # retrying would make the same answer
            break
        assert last is not None
        error = CompletionError(kind=last.kind, message=str(last), attempts=attempt)
        return self._completion(request, None, error)

    async def _once(self, request: CompletionRequest, attempt: int) -> Finished:
        deltas = Deltas(functools.partial(self._publish_delta, request, attempt), self._windows)
        stream = self._provider.complete(request)
        add = deltas.add
        try:
            async for output in stream:
                if isinstance(output, TextDelta):
                    add(output.text)
                elif isinstance(output, Finished):
                    # One more step ends a stream that keeps the contract (`Finished`
                    # last), so every generator it wraps ends too, rather than being
                    # finalized later by the loop's asyncgen hook: a thread-safe
                    # wake-up of the loop per completion, a GIL hand-off in Kafka mode.
                    with contextlib.suppress(StopAsyncIteration):
                        await stream.__anext__()
                    return output
        finally:
            # Whatever text came is published before the turn (or its retry event).
            deltas.flush()
            # Stop reading at `Finished`, and close the stream now, not at garbage
            # collection: a provider's stream holds an HTTP connection.
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()
        raise TransientModelError(
            f"the provider's stream ended without a finished turn ({request.request_id})"
        )

    def _publish_delta(self, request: CompletionRequest, attempt: int, first: int, text: str) -> None:
        # Labelled by the index of its first delta: ids stay unique and stable per attempt.
        self._sink.publish_event(self._event(request, "delta", f"{attempt}.{first}", text=text, data=None))

    def _retried(self, request: CompletionRequest, attempt: int, exc: ModelError, delay: float) -> None:
        detail = json.dumps({"attempt": attempt, "error": str(exc), "retry_in_s": delay}, sort_keys=True)
        self._sink.publish_event(
            self._event(request, "completion_retried", str(attempt), text=None, data=detail)
        )
        log.warning(
            "transient model error, retry %d in %.1fs: %s",
            attempt,
            delay,
            exc,
            extra={"thread_id": request.thread_id, "message_id": request.request_id},
        )

    def _event(
        self, request: CompletionRequest, kind: str, label: str, text: str | None, data: str | None
    ) -> ThreadEvent:
        # The records of every completion are built by position, in their fields' order (named
        # in the comments): by keyword, the names go into a dict and back out on their way
        # into `__init__` (a class is called through `tp_call`): a third of its cost.
        return ThreadEvent(
            derive_id(request.request_id, kind, label),  # event_id
            request.thread_id,  # thread_id
            self._clock(),  # created_at
            kind,  # kind
            True,  # ephemeral
            None,  # seq
            None,  # entry
            text,  # text
            data,  # data
        )

    def _completion(
        self, request: CompletionRequest, finished: Finished | None, error: CompletionError | None
    ) -> Input:
        body = Completion(  # by position (`_event` says why)
            request.request_id,  # request_id
            finished.content if finished else (),  # content
            finished.tool_calls if finished else (),  # tool_calls
            finished.usage if finished else Usage(0, 0, 0),  # usage
            finished.model if finished else request.model,  # model
            error,  # error
        )
        return Input(
            request.request_id,  # message_id
            request.thread_id,  # thread_id
            self._clock(),  # created_at
            SOURCE,  # source
            None,  # expires_at
            None,  # key_id
            None,  # signature
            body,  # body
        )


def _size_problem(finished: Finished, completion: Input) -> str | None:
    """Why `completion` is too large to send, or None. Encoded only when a cheap upper bound
    (4 bytes a character) does not already show it fits."""
    chars = sum(len(b.text) + len(getattr(b, "signature", None) or "") for b in finished.content)
    chars += sum(len(c.call_id) + len(c.name) + len(c.arguments) for c in finished.tool_calls)
    if 4 * chars + 4_096 <= COMPLETION_MAX_BYTES:
        return None
    size = len(encode_value(completion))
    if size <= COMPLETION_MAX_BYTES:
        return None
    return (f"the model's answer is {size} bytes, more than the {COMPLETION_MAX_BYTES} one input may "
            "carry: ask for a shorter answer")


# Built per input or per completion: a faster __init__, same signature (torpor.schemas.frozen).
fast_inits(__name__)
