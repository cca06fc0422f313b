"""The model stage: committed requests in, deltas and one Completion input out."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tests.processors.fold_scenarios import completion, control, create, user
from tests.processors.test_history_handover import CountingStore
from torpor.processors.fold.effects import RequestCompletion
from torpor.processors.fold.history import chain
from torpor.processors.fold.state import ThreadState
from torpor.processors.models.provider import (
    CompletionRequest,
    Finished,
    ModelInfo,
    ModelOutput,
    ScriptedModel,
    ScriptedTurn,
    ScriptRule,
    TextDelta,
)
from torpor.processors.models.providers.errors import RateLimitedError
from torpor.processors.models.stage import ModelStage, StageConfig
from torpor.processors.step import StepRecord, step
from torpor.processors.store import keys
from torpor.processors.store.kv import MemoryStore
from torpor.processors.store.statecodec import encode_entry
from torpor.processors.store.tables import HistoryCache, load_state, visible_entries
from torpor.schemas.records import (
    Completion,
    HistoryEntry,
    Input,
    InputBody,
    SummaryEntry,
    TextBlock,
    ThreadEvent,
    Usage,
    UserEntry,
)

FAST = StageConfig(backoff_initial_s=0.001, backoff_max_s=0.002, max_attempts=3)


@dataclass
class Sink:
    events: list[ThreadEvent] = field(default_factory=list)
    completions: list[Input] = field(default_factory=list)

    def publish_event(self, event: ThreadEvent) -> None:
        self.events.append(event)

    def publish_completion(self, completion: Input) -> None:
        self.completions.append(completion)


def envelope(message_id: str, body: InputBody, source: str = "user:u") -> Input:
    return Input(message_id, "t1", 1_000, source, None, None, None, body)


def thread_awaiting_model(store: MemoryStore) -> RequestCompletion:
    (request,) = step(store, [StepRecord(envelope("m-create", create(initial="ping")), 0, 0)]).completions
    return request


def run_stage(
    store: MemoryStore,
    turns: tuple[ScriptedTurn, ...],
    *requests: RequestCompletion,
    config: StageConfig = FAST,
) -> Sink:
    sink = Sink()

    async def go() -> None:
        stage = ModelStage(store, ScriptedModel([ScriptRule(turns=turns)]), sink, lambda: 5_000, config)
        for request in requests:
            stage.submit(request)
        await stage.wait_idle()

    asyncio.run(go())
    return sink


def test_a_completion_comes_back_as_an_input_named_by_its_request() -> None:
    store = MemoryStore()
    request = thread_awaiting_model(store)
    sink = run_stage(store, (ScriptedTurn(chunks=("po", "ng")),), request)
    (answer,) = sink.completions
    assert (answer.message_id, answer.source, answer.created_at) == (request.request_id, "processor", 5_000)
    assert isinstance(answer.body, Completion) and answer.body.content == (TextBlock("pong"),)
    assert answer.body.error is None
    # Both chunks came within the delta window: one live event carries their text.
    assert [(e.kind, e.ephemeral, e.text) for e in sink.events] == [("delta", True, "pong")]
    # Folding it commits the turn.
    out = step(store, [StepRecord(answer, 0, 1)])
    assert [r.disposition for r in out.receipts] == ["applied"]


def test_transient_errors_are_retried_visibly_then_succeed() -> None:
    store = MemoryStore()
    request = thread_awaiting_model(store)
    sink = run_stage(store, (ScriptedTurn(chunks=("ok",), transient_failures=2),), request)
    assert [e.kind for e in sink.events if e.kind != "delta"] == ["completion_retried", "completion_retried"]
    (answer,) = sink.completions
    assert isinstance(answer.body, Completion) and answer.body.error is None


def test_exhausted_retries_give_an_error_completion_that_parks_the_thread() -> None:
    store = MemoryStore()
    request = thread_awaiting_model(store)
    sink = run_stage(store, (ScriptedTurn(transient_failures=10),), request)
    (answer,) = sink.completions
    assert isinstance(answer.body, Completion) and answer.body.error is not None
    assert (answer.body.error.kind, answer.body.error.attempts) == ("transient", 3)
    out = step(store, [StepRecord(answer, 0, 1)])
    assert out.receipts[-1].disposition in ("applied", "parked")
    state = load_state(store, "t1")
    assert state is not None and state.status.value == "parked"


def test_a_permanent_error_is_not_retried() -> None:
    store = MemoryStore()
    request = thread_awaiting_model(store)
    sink = run_stage(store, (ScriptedTurn(permanent_failure=True),), request)
    (answer,) = sink.completions
    assert isinstance(answer.body, Completion) and answer.body.error is not None
    assert answer.body.error.attempts == 1 and not sink.events


def test_a_request_the_thread_no_longer_awaits_is_dropped() -> None:
    store = MemoryStore()
    request = thread_awaiting_model(store)
    answer = envelope(request.request_id, completion(request.request_id, "done"), source="processor")
    step(store, [StepRecord(answer, 0, 1)])
    sink = run_stage(store, (ScriptedTurn(chunks=("late",)),), request)
    assert sink.completions == [] and sink.events == []


def test_resume_reissues_the_requests_of_threads_awaiting_the_model() -> None:
    store = MemoryStore()
    request = thread_awaiting_model(store)
    sink = Sink()

    async def go() -> int:
        stage = ModelStage(store, ScriptedModel([]), sink, lambda: 1, FAST)
        started = stage.resume()
        assert not stage.submit(request)  # already in flight: not started twice
        await stage.wait_idle()
        return started

    assert asyncio.run(go()) == 1
    assert [c.message_id for c in sink.completions] == [request.request_id]


def test_concurrency_is_bounded() -> None:
    store = MemoryStore()
    requests = []
    for i in range(6):
        thread = f"t{i}"
        item = Input(f"m{i}", thread, 1, "user:u", None, None, None, create(initial="go"))
        requests.extend(step(store, [StepRecord(item, 0, i)]).completions)
    running = 0
    peak = 0

    class Counting(ScriptedModel):
        async def complete(self, request):  # type: ignore[no-untyped-def, override]
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1  # the stage stops reading at `Finished`: count before delegating
            async for out in ScriptedModel.complete(self, request):
                yield out

    sink = Sink()

    async def go() -> None:
        stage = ModelStage(store, Counting([]), sink, lambda: 1, StageConfig(concurrency=2))
        for request in requests:
            stage.submit(request)
        await stage.wait_idle()

    asyncio.run(go())
    assert len(sink.completions) == 6 and peak == 2


def test_user_text_folded_meanwhile_makes_the_old_request_stale() -> None:
    store = MemoryStore()
    request = thread_awaiting_model(store)
    step(store, [StepRecord(envelope("m-more", user("and another thing")), 0, 1)])
    sink = run_stage(store, (ScriptedTurn(chunks=("x",)),), request)
    # Either the fold kept the request (then it is answered) or replaced it (then dropped).
    assert len(sink.completions) <= 1


def test_with_no_delta_window_every_delta_is_an_event_of_its_own() -> None:
    store = MemoryStore()
    request = thread_awaiting_model(store)
    config = StageConfig(backoff_initial_s=0.001, backoff_max_s=0.002, delta_window_s=0.0)
    sink = run_stage(store, (ScriptedTurn(chunks=("po", "ng")),), request, config=config)
    assert [(e.kind, e.text) for e in sink.events] == [("delta", "po"), ("delta", "ng")]
    assert len({e.event_id for e in sink.events}) == 2


class Quiet:
    """Streams "a", then goes quiet until the stage has published it, then "b" and the turn."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def models(self) -> tuple[ModelInfo, ...]:
        return (ModelInfo("quiet", 1_000, supports_images=False),)

    async def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        yield TextDelta("a")
        async with asyncio.timeout(60.0):  # the window's timer must publish "a" meanwhile
            while not self.sink.events:
                await asyncio.sleep(0.005)
        yield TextDelta("b")
        yield TextDelta("c")
        yield Finished((TextBlock("abc"),), (), Usage(0, 0, 0), "quiet")


def test_a_delta_is_published_within_the_window_while_the_provider_is_quiet() -> None:
    store = MemoryStore()
    request = thread_awaiting_model(store)
    sink = Sink()

    async def go() -> None:
        stage = ModelStage(store, Quiet(sink), sink, lambda: 1, StageConfig(delta_window_s=0.02))
        stage.submit(request)
        await stage.wait_idle()

    asyncio.run(go())
    assert [e.text for e in sink.events] == ["a", "bc"]  # in order, nothing lost or repeated
    assert len({e.event_id for e in sink.events}) == 2
    (answer,) = sink.completions
    assert isinstance(answer.body, Completion) and answer.body.error is None


class Recording(ScriptedModel):
    """A scripted model that remembers the history of every request it was asked."""

    histories: list[CompletionRequest]

    async def complete(self, request):  # type: ignore[no-untyped-def, override]
        self.histories.append(request)
        async for out in ScriptedModel.complete(self, request):
            yield out


def serve(store: MemoryStore, stage: ModelStage, sink: Sink, request: RequestCompletion) -> Input:
    async def go() -> None:
        stage.submit(request)
        await stage.wait_idle()

    asyncio.run(go())
    return sink.completions[-1]


def test_the_cached_history_of_a_thread_is_what_the_store_holds_at_every_turn() -> None:
    store = MemoryStore()
    request = thread_awaiting_model(store)
    sink = Sink()
    model = Recording([ScriptRule(turns=(ScriptedTurn(chunks=("pong",)),) * 4)])
    model.histories = []
    stage = ModelStage(store, model, sink, lambda: 1, FAST)
    for turn in range(3):
        answer = serve(store, stage, sink, request)
        step(store, [StepRecord(answer, 0, 10 * turn + 1)])
        text = envelope(f"m-{turn}", user(f"again {turn}"))
        (request,) = step(store, [StepRecord(text, 0, 10 * turn + 2)]).completions
    serve(store, stage, sink, request)
    assert len(model.histories) == 4
    for asked in model.histories:
        assert asked.history == visible_entries(store, "t1", 0, len(asked.history))
    assert len(model.histories[-1].history) > len(model.histories[0].history) > 0


def _cached_thread_awaiting_model(
        capacity: int) -> tuple[MemoryStore, HistoryCache, RequestCompletion, ThreadState]:
    """A store with thread t1 awaiting the model, its state, and an empty history cache."""
    store = MemoryStore()
    request = thread_awaiting_model(store)
    state = load_state(store, "t1")
    assert state is not None
    return store, HistoryCache(capacity=capacity), request, state


def test_a_thread_deleted_and_created_again_is_not_served_its_old_history() -> None:
    store, cache, first, state = _cached_thread_awaiting_model(capacity=8)
    old = cache.visible(store, state, first.history_len)
    step(store, [StepRecord(envelope("m-delete", control("delete"), source="operator:o"), 0, 1)])
    assert load_state(store, "t1") is None
    # Made after the deletion (a creation made before it is refused: the thread's tombstone).
    again = dataclasses.replace(envelope("m-create-2", create(initial="a different first text")),
                                created_at=1_000_000)
    (second,) = step(store, [StepRecord(again, 0, 2)]).completions
    state = load_state(store, "t1")
    assert state is not None
    fresh = cache.visible(store, state, second.history_len)
    assert fresh == visible_entries(store, "t1", 0, second.history_len)
    assert fresh != old


def test_a_cached_thread_whose_history_gains_a_summary_is_served_from_the_summary_on() -> None:
    store, cache, request, state = _cached_thread_awaiting_model(capacity=64)
    first = cache.visible(store, state, request.history_len)  # cached, summary-free
    summary = HistoryEntry(len(first), 2_000, "m-sum", SummaryEntry("what happened", len(first)))
    after = HistoryEntry(len(first) + 1, 2_000, "m-after", UserEntry((TextBlock("and then"),), False))
    # What the step writes for an appended summary: the entry and the summary row, in one batch.
    store.apply([(keys.history_key("t1", summary.seq), encode_entry(summary)),
                 (keys.summary_key("t1"), keys.encode_seq(summary.seq)),
                 (keys.history_key("t1", after.seq), encode_entry(after))])
    grown = dataclasses.replace(state, history_len=after.seq + 1, head=chain((*first, summary, after)))
    served = cache.visible(store, grown, grown.history_len)
    assert served == visible_entries(store, "t1", 0, grown.history_len) == (summary, after)
    assert cache.visible(store, grown, grown.history_len) == (summary, after)  # and again, uncached


def test_the_history_cache_keeps_at_most_its_capacity_of_entries() -> None:
    store = MemoryStore()
    cache = HistoryCache(capacity=2)  # entries: one thread's creation writes one
    for i in range(5):
        item = Input(f"m{i}", f"t{i}", 1, "user:u", None, None, None, create(initial="go"))
        (request,) = step(store, [StepRecord(item, 0, i)]).completions
        state = load_state(store, f"t{i}")
        assert state is not None
        assert cache.visible(store, state, request.history_len) == visible_entries(
            store, f"t{i}", 0, request.history_len
        )
    assert len(cache) == 2


def _created(store: MemoryStore, thread_ids: list[str]) -> dict[str, ThreadState]:
    """Each thread created (one history entry each) and its state."""
    states = {}
    for offset, thread_id in enumerate(thread_ids):
        item = Input(f"m-{thread_id}", thread_id, 1, "user:u", None, None, None, create(initial="go"))
        step(store, [StepRecord(item, 0, offset)])
        state = load_state(store, thread_id)
        assert state is not None
        states[thread_id] = state
    return states


def _serve(cache: HistoryCache, counted: CountingStore, state: ThreadState) -> bool:
    """Serve `state`'s thread; True if no history row was read (served from memory)."""
    before = counted.history_reads
    served = cache.visible(counted, state, state.history_len)
    assert served == visible_entries(counted.inner, state.thread_id, 0, state.history_len)
    return counted.history_reads == before


def test_threads_served_in_turn_beyond_the_capacity_keep_a_stable_share_in_memory() -> None:
    counted = CountingStore()
    states = _created(counted.inner, [f"t{i}" for i in range(5)])
    cache = HistoryCache(capacity=2)  # two of the five threads' one entry each
    rounds = [[_serve(cache, counted, state) for state in states.values()] for _ in range(4)]
    # The first two fit; the others are read every time and never displace them. Admitting
    # every thread read (least recently served out) would serve none from memory.
    assert rounds[0] == [False] * 5
    assert rounds[1:] == [[True, True, False, False, False]] * 3
    assert len(cache) == 2


def test_threads_gone_idle_give_their_places_to_the_threads_running_now() -> None:
    counted = CountingStore()
    states = _created(counted.inner, ["old-1", "old-2", "new-1", "new-2"])
    cache = HistoryCache(capacity=2)
    for name in ("old-1", "old-2", "old-1", "old-2"):
        _serve(cache, counted, states[name])
    # From now on only the new threads run: read on their first serve, kept from the
    # second (the idle threads were served before it), served from memory after that.
    assert [_serve(cache, counted, states[name]) for name in ("new-1", "new-2") * 3] == [
        False, False, False, False, True, True]


@dataclass
class Throttled:
    """A provider that answers 429 with `retry-after` first, then text."""

    hints: list[float | None]
    model: str = "throttled"

    def models(self) -> tuple[ModelInfo, ...]:
        return (ModelInfo(self.model, 1000, False),)

    async def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        if self.hints:
            raise RateLimitedError("slow down", retry_after_s=self.hints.pop(0))
        yield Finished((TextBlock("at last"),), (), Usage(0, 0, 0), self.model)


def test_a_rate_limits_retry_after_is_waited_for_within_the_bound() -> None:
    store = MemoryStore()
    request = thread_awaiting_model(store)
    sink = Sink()
    config = StageConfig(backoff_initial_s=0.001, backoff_max_s=0.002, max_retry_after_s=0.2)

    async def go() -> None:
        stage = ModelStage(store, Throttled([0.05, None, 60.0]), sink, lambda: 5_000, config)
        stage.submit(request)
        await stage.wait_idle()

    asyncio.run(go())
    waits = [json.loads(e.data or "{}")["retry_in_s"] for e in sink.events if e.kind == "completion_retried"]
    # The hint, the plain backoff without one, and a hint beyond the bound cut to it.
    assert waits == [0.05, 0.002, 0.2]
    (answer,) = sink.completions
    assert isinstance(answer.body, Completion) and answer.body.error is None
