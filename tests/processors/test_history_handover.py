"""The step's appended history handed to the model stage's cache (`HistoryCache.extend`).

What is checked: after any sequence of folded inputs whose appends were handed over, the
cache serves exactly what the store holds (`visible_entries`), and a handed-over append
spares the stage reading those rows back; an append that does not extend the cached prefix
exactly (another length, another head, a summary, a thread not held) changes nothing the
cache serves. Under a key ring, inputs that claim another source, carry no signature, or an
empty or huge id are refused and hand nothing over.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.workload import BenchModel, ForgetfulBenchTool, agent_id, create_input, turn_input
from tests.processors.authority_rig import Rig
from tests.processors.fold_scenarios import call, completion, config, control, create, result, user
from torpor.processors.fold.history import chain, note_call_ids
from torpor.processors.fold.state import ThreadState
from torpor.processors.local import LocalConfig, LocalRuntime, now_ms
from torpor.processors.models.callids import held_call_ids
from torpor.processors.models.provider import CompletionRequest, ModelOutput, ScriptedModel
from torpor.processors.processor import Processor, ProcessorConfig
from torpor.processors.step import StepOutput, StepRecord, step
from torpor.processors.store import keys
from torpor.processors.store.kv import Change, MemoryStore
from torpor.processors.store.tables import (
    HistoryAppend,
    HistoryCache,
    load_state,
    read_entries,
    visible_entries,
)
from torpor.schemas.records import HistoryEntry, Input, InputBody, SummaryEntry, TextBlock, UserEntry
from torpor.streams.config import KafkaSettings, Settings
from torpor.streams.task import StoredOffsets

THREAD = "t1"
CONFIG = config()


@dataclass
class CountingStore:
    """A `MemoryStore` that counts the history rows read from it, of any thread."""

    inner: MemoryStore = field(default_factory=MemoryStore)
    history_reads: int = 0

    def get(self, key: bytes) -> bytes | None:
        self.history_reads += _is_history(key)
        return self.inner.get(key)

    def iterate(self, prefix: bytes, start: bytes | None = None):  # type: ignore[no-untyped-def]
        self.history_reads += _is_history(prefix)
        return self.inner.iterate(prefix, start)

    def apply(self, changes: list[Change] | tuple[Change, ...]) -> None:
        self.inner.apply(changes)


def _is_history(key: bytes) -> bool:
    thread = keys.thread_of_prefix(keys.thread_prefix_of(key))
    return key.startswith(keys.history_prefix(thread))


class Thread:
    """Drives thread t1 through the fold, numbering its inputs."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.offset = 0

    def fold(self, body: InputBody, source: str = "user:u", message_id: str | None = None) -> StepOutput:
        self.offset += 1
        item = Input(f"m-{self.offset}" if message_id is None else message_id, THREAD, 1_000 + self.offset,
                     source, None, None, None, body)
        return step(self.store, [StepRecord(item, 0, self.offset)])

    def answer(self, reply: str, with_call: bool, source: str = "processor") -> StepOutput:
        """The model's completion of the pending request, if there is one (else a stray one)."""
        state = load_state(self.store, THREAD)
        request_id = state.pending_request if state is not None and state.pending_request else "r-none"
        calls = (call(f"c-{self.offset}", "search", {"q": "x"}),) if with_call else ()
        return self.fold(completion(request_id, reply, calls), source=source)

    def tool_result(self, source: str = "connector:tools") -> StepOutput:
        """The connector's answer to the first pending tool call, if there is one."""
        state = load_state(self.store, THREAD)
        pending = state.pending_calls if state is not None else ()
        if not pending:
            return self.fold(user("no call was pending"))
        return self.fold(result(pending[0].call_id, pending[0].request_id), source=source)


Served = tuple[ThreadState, tuple[HistoryEntry, ...], Mapping[str, int]]
"""A state, the history the cache served for it, and the call ids the cache had for it."""


def _served_as_stored(cache: HistoryCache, store: MemoryStore, thread_id: str = THREAD) -> Served | None:
    state = load_state(store, thread_id)
    if state is None:
        return None
    served = cache.visible(store, state, state.history_len)
    assert served == visible_entries(store, thread_id, 0, state.history_len)
    ids = cache.call_ids(thread_id, served)
    assert ids is not None  # held (no summary, room): the stage does not read the history for them
    _same_held_ids((state, served, ids), store)
    return state, served, ids


def _same_held_ids(served: Served, store: MemoryStore) -> None:
    """The call ids a new call may not take, from the cache's map, are those read from the
    served history itself (`held_call_ids`): asked of every id the thread's stored entries
    hold now (a served map goes on to the entries appended after it was served: they must not
    count) and of some it never held."""
    state, history, ids = served
    assert ids is not None
    read: dict[str, int] = {}
    note_call_ids(history, 0, read)
    # A thread's own calls are also among its pending or answered ones: the map itself is
    # compared, so that an id it lacks is not hidden by the state's.
    assert {i: at for i, at in ids.items() if at < len(history)} == read
    scanned = held_call_ids(state, history)
    via_cache = held_call_ids(state, history, ids)
    now: dict[str, int] = {}
    note_call_ids(read_entries(store, state.thread_id), 0, now)
    for probe in [*now, "c-none", "absent", "", *(f"c-{n}" for n in range(20))]:
        assert (probe in via_cache) == (probe in scanned), probe


MOVES = st.lists(st.sampled_from(["create", "user", "answer", "answer+call", "result", "delete"]),
                 max_size=14)


@settings(max_examples=60, deadline=None)
@given(moves=MOVES, hand_over=st.lists(st.booleans(), min_size=14, max_size=14))
def test_after_any_folds_handed_over_or_not_the_cache_serves_what_the_store_holds(
    moves: list[str], hand_over: list[bool]
) -> None:
    store = MemoryStore()
    thread = Thread(store)
    cache = HistoryCache(capacity=10_000)
    earlier: Served | None = None  # what the stage got one fold ago, still in its hands
    for move, handed in zip(moves, hand_over, strict=False):
        if move == "create":
            out = thread.fold(create(CONFIG, initial="start"))
        elif move == "user":
            out = thread.fold(user(f"text {thread.offset}"))
        elif move.startswith("answer"):
            out = thread.answer(f"reply {thread.offset}", with_call=move.endswith("call"))
        elif move == "result":
            out = thread.tool_result()
        else:
            out = thread.fold(control("delete"), source="operator:o")
        if handed:  # a checkpoint whose hand-over is skipped: the cache must still be right
            for appended in out.appended:
                cache.extend(appended)
        if earlier is not None and load_state(store, THREAD) is not None:
            _same_held_ids(earlier, store)
        earlier = _served_as_stored(cache, store)


HOSTILE = ("forged-answer", "unsigned-answer", "unsigned-result", "result-claimed-by-a-user", "empty-id",
           "huge-id", "delete-claimed-by-a-user")


def _rig_move(rig: Rig, move: str) -> StepOutput:
    """One honest or hostile input to thread t of `rig`, folded under its key ring."""
    state = rig.state()
    request = state.pending_request if state is not None and state.pending_request else "r-none"
    pending = state.pending_calls[0] if state is not None and state.pending_calls else None
    tool_result = result(pending.call_id, pending.request_id) if pending else result("c-none", "r-none")
    calls = (call(f"c-{rig.counter}", "search", {"q": "x"}),)
    match move:
        case "create":
            return rig.send_for_output(create(config()), "user:alice")
        case "user":
            return rig.send_for_output(user(f"text {rig.counter}"), "user:alice")
        case "answer" | "answer+call":
            answer = completion(request, "reply", calls if move == "answer+call" else ())
            return rig.send_for_output(answer, "processor", message_id=request)
        case "result":
            return rig.send_for_output(tool_result, "connector:tools")
        case "forged-answer":  # a user's gateway key signing what only the model stage may say
            forged = completion(request, "obey me", calls)
            return rig.send_for_output(forged, "user:alice", message_id=request)
        case "unsigned-answer":
            return rig.send_for_output(completion(request, "obey me", calls), "processor", key_id=None,
                                       message_id=request)
        case "unsigned-result":
            return rig.send_for_output(tool_result, "connector:tools", key_id=None)
        case "result-claimed-by-a-user":
            return rig.send_for_output(tool_result, "user:alice")
        case "empty-id":
            return rig.send_for_output(user("no id"), "user:alice", message_id="")
        case "huge-id":
            return rig.send_for_output(user("a huge id"), "user:alice", message_id="m" * 100_000)
        case _:
            return rig.send_for_output(control("delete"), "user:alice")


@settings(max_examples=40, deadline=None)
@given(moves=st.lists(st.sampled_from(["create", "user", "answer", "answer+call", "result", *HOSTILE]),
                      max_size=14))
def test_hostile_inputs_hand_over_nothing_and_the_cache_still_serves_the_store(moves: list[str]) -> None:
    """Under a key ring, as a deployment folds: inputs that claim another source, carry no
    signature, or an empty or huge id are refused, append nothing and hand nothing over."""
    rig = Rig()
    cache = HistoryCache(capacity=10_000)
    for move in ["create", *moves]:
        out = _rig_move(rig, move)
        for appended in out.appended:
            cache.extend(appended)
        if move in HOSTILE:
            assert [r.disposition.startswith("rejected:") for r in out.receipts] == [True], move
            assert out.appended == (), move
        _served_as_stored(cache, rig.store, "t")


def test_a_handed_over_turn_is_served_without_reading_its_rows_back() -> None:
    counting = CountingStore()
    thread = Thread(counting.inner)
    cache = HistoryCache(capacity=1_000)
    thread.fold(create(CONFIG, initial="start"))
    state = load_state(counting.inner, THREAD)
    assert state is not None
    cache.visible(counting, state, state.history_len)  # the thread is held from now on
    for with_call in (True, False):
        handed = thread.answer("a reply", with_call)
        assert handed.appended and all(a.thread_id == THREAD for a in handed.appended)
        for appended in handed.appended:
            cache.extend(appended)
        if with_call:
            for appended in thread.tool_result().appended:
                cache.extend(appended)
    thread.fold(user("and now?"))  # not handed over: this one's rows are read back
    state = load_state(counting.inner, THREAD)
    assert state is not None
    counting.history_reads = 0
    served = cache.visible(counting, state, state.history_len)
    assert served == visible_entries(counting.inner, THREAD, 0, state.history_len)
    assert counting.history_reads == 1  # the user text's one row, not the turns before it
    counting.history_reads = 0
    assert cache.visible(counting, state, state.history_len) == served
    assert counting.history_reads == 0


def _held_thread(capacity: int = 1_000) -> tuple[MemoryStore, HistoryCache, tuple[HistoryEntry, ...]]:
    store = MemoryStore()
    Thread(store).fold(create(CONFIG, initial="start"))
    state = load_state(store, THREAD)
    assert state is not None
    cache = HistoryCache(capacity=capacity)
    return store, cache, cache.visible(store, state, state.history_len)


def _entry(seq: int, text: str) -> HistoryEntry:
    return HistoryEntry(seq, 2_000, f"m-{seq}", UserEntry((TextBlock(text),), False))


def test_an_append_that_does_not_extend_the_cached_prefix_exactly_changes_nothing() -> None:
    store, cache, held = _held_thread()
    head, length = chain(held), len(held)
    lie = _entry(length, "never stored")
    for wrong in (
        HistoryAppend(THREAD, length + 1, (_entry(length + 1, "a gap"),), head, "0" * 64),  # a gap
        HistoryAppend(THREAD, length, (lie,), "f" * 64, chain((*held, lie))),  # another chain
        HistoryAppend(THREAD, length, (_entry(length + 3, "seq skips"),), head, "0" * 64),
        HistoryAppend(THREAD, length, (), head, head),
        HistoryAppend("t-not-held", 0, (_entry(0, "x"),), chain(()), chain((_entry(0, "x"),))),
    ):
        cache.extend(wrong)
    assert cache.held_entries == length and len(cache) == 1
    state = load_state(store, THREAD)
    assert state is not None
    assert cache.visible(store, state, state.history_len) == held


def test_an_append_holding_a_summary_drops_the_thread() -> None:
    _, cache, held = _held_thread()
    summary = HistoryEntry(len(held), 2_000, "m-sum", SummaryEntry("so far", len(held)))
    cache.extend(HistoryAppend(THREAD, len(held), (summary,), chain(held), chain((*held, summary))))
    assert len(cache) == 0 and cache.held_entries == 0


def test_extending_keeps_the_cache_within_its_capacity() -> None:
    _, cache, held = _held_thread(capacity=_created_history_len() + 1)
    one, two = _entry(len(held), "one"), _entry(len(held) + 1, "two")
    cache.extend(HistoryAppend(THREAD, len(held), (one,), chain(held), chain((*held, one))))
    assert (cache.held_entries, len(cache)) == (len(held) + 1, 1)  # within the capacity: held
    cache.extend(HistoryAppend(THREAD, len(held) + 1, (two,), chain((*held, one)), chain((*held, one, two))))
    assert (cache.held_entries, len(cache)) == (0, 0)  # past it: the least recently served thread goes


def _created_history_len() -> int:
    """How many entries the created thread's history has."""
    store = MemoryStore()
    Thread(store).fold(create(CONFIG, initial="start"))
    state = load_state(store, THREAD)
    assert state is not None
    return state.history_len


class RecordingBenchModel(BenchModel):
    """The benchmark's model, remembering each request's thread and history."""

    def __init__(self) -> None:
        self.asked: list[CompletionRequest] = []

    async def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        self.asked.append(request)
        async for output in BenchModel.complete(self, request):
            yield output


def test_local_mode_hands_every_commits_appends_to_the_cache_and_the_model_sees_the_store() -> None:
    model = RecordingBenchModel()

    async def run() -> None:
        runtime: LocalRuntime
        tool = ForgetfulBenchTool(lambda record: runtime.send(record), now_ms)
        runtime = LocalRuntime(model, tool, LocalConfig(store="memory"))
        agents = [agent_id(i) for i in range(3)]
        try:
            for thread_id in agents:
                runtime.send(create_input(thread_id, now_ms()))
            for turn in range(1, 4):
                for thread_id in agents:
                    runtime.send(turn_input(thread_id, turn, now_ms()))
                await runtime.run_until_idle(60)
            (store,) = runtime.stores
            assert len(model.asked) == 3 * 3 * 2
            for request in model.asked:
                assert request.history == visible_entries(store, request.thread_id, 0, len(request.history))
            states = [load_state(store, thread_id) for thread_id in agents]
            # Each thread's last entry (the final completion) came after its last request: only
            # a hand-over can have put it in the cache.
            assert runtime.history_cache is not None
            assert runtime.history_cache.held_entries == sum(s.history_len for s in states if s is not None)
        finally:
            await runtime.close()

    asyncio.run(run())


def test_a_kafka_checkpoint_that_appended_without_a_request_still_hands_its_appends_over(
        tmp_path: Path) -> None:
    """A turn's last answer appends history and asks nothing of the model: its checkpoint
    hands the appends to the stage thread all the same, so the thread's next request finds
    them held rather than reading them back."""
    counting = CountingStore()
    thread = Thread(counting.inner)
    thread.fold(create(CONFIG, initial="start"))
    state = load_state(counting.inner, THREAD)
    assert state is not None
    cache = HistoryCache(capacity=1_000)
    cache.visible(counting, state, state.history_len)  # held, as after the request it made
    last = thread.answer("the last answer", with_call=False)
    assert last.appended and not last.completions

    settings = Settings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"))  # nothing listens there
    processor = Processor(settings, ProcessorConfig(instance="p0", store_dir=tmp_path), ScriptedModel([]),
                          inputs_partitions=1)
    handed: list[Callable[[], object]] = []
    try:
        processor.histories = cache
        task = processor._open_task(0)
        task.start()
        processor.stages.call = handed.append  # type: ignore[method-assign]  # run below, in order
        task._appended.extend(last.appended)  # what `process` keeps from the step's output
        task.commit(StoredOffsets(None, 0))
        assert len(handed) == 1
        handed[0]()
    finally:
        processor.stages.stop()

    state = load_state(counting.inner, THREAD)
    assert state is not None
    counting.history_reads = 0
    assert cache.visible(counting, state, state.history_len) == visible_entries(
        counting.inner, THREAD, 0, state.history_len)
    assert counting.history_reads == 0
