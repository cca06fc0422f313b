"""The ids a provider gives its tool calls: every call the model made can be answered.

A provider's call ids are not trusted (`callids.carried_calls`): some servers send none or
the same one for every call, or `call_0` at every turn; a broken or hostile one can send
megabytes. These tests fold what the stage publishes and answer every dispatch as a
connector would: the thread must get every answer and ask the model again, never wait for
a result that cannot bind.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.processors.fold_scenarios import call, create, result
from tests.processors.test_stage import FAST, Sink, envelope
from torpor.processors.fold.effects import RequestCompletion
from torpor.processors.fold.state import Status
from torpor.processors.models.callids import CARRIED_CALL_ID, carried_calls, held_call_ids
from torpor.processors.models.provider import CompletionRequest, Finished, ModelInfo, ModelOutput
from torpor.processors.models.stage import ModelStage
from torpor.processors.step import StepOutput, StepRecord, step
from torpor.processors.store.kv import MemoryStore
from torpor.processors.store.tables import load_state, read_entries
from torpor.schemas.ids import MAX_ID_LENGTH, derive_id, id_problem
from torpor.schemas.records import (
    AssistantEntry,
    Completion,
    Dispatch,
    TextBlock,
    ToolCall,
    ToolResultEntry,
    Usage,
)

HUGE = "c" * 100_000


@dataclass
class NamingModel:
    """A provider that makes one call of tool `name` per id in `ids` at every turn, named so."""

    ids: Sequence[str]
    name: str = "search"
    arguments: dict[str, str] | None = None
    requests: list[CompletionRequest] = field(default_factory=list)

    def models(self) -> tuple[ModelInfo, ...]:
        return (ModelInfo("scripted", 100_000, supports_images=False),)

    async def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        self.requests.append(request)
        calls = tuple(call(call_id, self.name, self.arguments or {"q": f"q{i}"})
                      for i, call_id in enumerate(self.ids))
        yield Finished((TextBlock("looking"),), calls, Usage(0, 0, 0), "scripted")


def serve(store: MemoryStore, model: NamingModel, request: RequestCompletion) -> Completion:
    """What the stage publishes for `request`, folded into `store`; the completion's body."""
    sink = Sink()

    async def go() -> None:
        stage = ModelStage(store, model, sink, lambda: 5_000, FAST)
        stage.submit(request)
        await stage.wait_idle()

    asyncio.run(go())
    (answer,) = sink.completions
    assert isinstance(answer.body, Completion) and answer.body.error is None
    return answer.body


def answer_all(store: MemoryStore, dispatches: Sequence[Dispatch], offset: int,
               subscription: bool = False) -> StepOutput:
    """Each dispatch answered as a connector answers it: its call id and request id back."""
    records = [
        StepRecord(envelope(derive_id(d.request_id, "result"),
                            result(d.call_id, d.request_id, subscription=subscription), "tool:search"),
                   0, offset + i)
        for i, d in enumerate(dispatches)
    ]
    return step(store, records)


def one_turn(ids: Sequence[str]) -> tuple[MemoryStore, Completion, StepOutput, StepOutput]:
    """A thread created, the model's calls named `ids`, folded, every dispatch answered."""
    store = MemoryStore()
    (request,) = step(store, [StepRecord(envelope("m-create", create(initial="go")), 0, 0)]).completions
    body = serve(store, NamingModel(ids), request)
    turn = step(store, [StepRecord(envelope(request.request_id, body, "processor"), 0, 1)])
    answers = answer_all(store, turn.dispatches, 2)
    return store, body, turn, answers


def test_calls_named_alike_empty_or_huge_are_each_dispatched_and_answered() -> None:
    store, body, turn, answers = one_turn(["dup", "dup", "", HUGE, "fine_id"])
    ids = [c.call_id for c in body.tool_calls]
    assert ids[0] == "dup" and ids[4] == "fine_id"  # good ids are kept as the provider gave them
    assert len(set(ids)) == 5 and all(CARRIED_CALL_ID.fullmatch(i) for i in ids)
    assert [c.arguments for c in body.tool_calls] == [f'{{"q": "q{i}"}}' for i in range(5)]
    assert len(turn.dispatches) == 5 and len({d.request_id for d in turn.dispatches}) == 5
    assert [r.disposition for r in answers.receipts] == ["applied"] * 5
    state = load_state(store, "t1")
    assert state is not None and state.status is Status.AWAITING_MODEL and not state.pending_calls
    assert len(answers.completions) == 1  # the model is asked again, with every result
    results = [e.body for e in read_entries(store, "t1") if isinstance(e.body, ToolResultEntry)]
    assert sorted(r.call_id for r in results) == sorted(ids)


@pytest.mark.parametrize("call_id", ["call_0", HUGE])
def test_a_provider_that_reuses_an_id_every_turn_is_answered_every_turn(call_id: str) -> None:
    # Twelve turns: a thread remembers its answered ids, and ten of a huge one passed a row's
    # bound (every later result refused as too large, the thread waiting for good).
    store = MemoryStore()
    model = NamingModel([call_id])
    (request,) = step(store, [StepRecord(envelope("m-create", create(initial="go")), 0, 0)]).completions
    offset = 1
    seen: list[str] = []
    for _ in range(12):
        body = serve(store, model, request)
        seen.extend(c.call_id for c in body.tool_calls)
        turn = step(store, [StepRecord(envelope(request.request_id, body, "processor"), 0, offset)])
        answers = answer_all(store, turn.dispatches, offset + 1)
        offset += 1 + len(turn.dispatches)
        assert [r.disposition for r in answers.receipts] == ["applied"]
        (request,) = answers.completions
    assert len(set(seen)) == 12 and all(CARRIED_CALL_ID.fullmatch(i) for i in seen)
    assert (seen[0] == call_id) == (call_id == "call_0")  # a good id is kept the first time
    # The provider was shown the renamed ids on the calls and on their results alike (its
    # last request came before the last turn's call).
    shown = [e.body for e in model.requests[-1].history]
    called = [c.call_id for b in shown if isinstance(b, AssistantEntry) for c in b.tool_calls]
    answered = [b.call_id for b in shown if isinstance(b, ToolResultEntry)]
    assert called == answered == seen[:-1]


def test_a_call_may_not_take_the_id_of_a_subscription_the_thread_holds() -> None:
    store = MemoryStore()
    (request,) = step(store, [StepRecord(envelope("m-create", create(initial="go")), 0, 0)]).completions
    # Turn one: a call "sub" whose result starts a subscription; the thread goes on.
    body = serve(store, NamingModel(["sub"]), request)
    turn = step(store, [StepRecord(envelope(request.request_id, body, "processor"), 0, 1)])
    answers = answer_all(store, turn.dispatches, 2, subscription=True)
    state = load_state(store, "t1")
    assert state is not None and [s.call_id for s in state.subscriptions] == ["sub"]
    # Turn two names its call "sub" again: it gets an id of its own, and its answer binds.
    (request,) = answers.completions
    body = serve(store, NamingModel(["sub"]), request)
    (renamed,) = body.tool_calls
    assert renamed.call_id != "sub" and CARRIED_CALL_ID.fullmatch(renamed.call_id)
    turn = step(store, [StepRecord(envelope(request.request_id, body, "processor"), 0, 3)])
    answers = answer_all(store, turn.dispatches, 4)
    assert [r.disposition for r in answers.receipts] == ["applied"]
    state = load_state(store, "t1")
    assert state is not None and state.status is Status.AWAITING_MODEL and not state.pending_calls
    assert [s.call_id for s in state.subscriptions] == ["sub"]


@given(
    ids=st.lists(st.one_of(st.sampled_from(["", "x", "call_0", "tp_0", "a b", "ü", "functions.search:0",
                                            "c" * 40, "c" * 41, HUGE[:MAX_ID_LENGTH + 1]]),
                           st.text(max_size=40)), max_size=8),
    taken=st.frozensets(st.sampled_from(["x", "call_0", "y"]), max_size=3),
)
def test_carried_ids_are_wire_ids_unique_and_free_and_good_ones_are_kept(ids: list[str],
                                                                         taken: frozenset[str]) -> None:
    calls = tuple(ToolCall(call_id, f"tool{i}", f'{{"i": {i}}}') for i, call_id in enumerate(ids))
    carried = carried_calls("req-1", calls, taken)
    assert carried == carried_calls("req-1", calls, taken)  # a pure function of its arguments
    assert [(c.name, c.arguments) for c in carried] == [(c.name, c.arguments) for c in calls]
    out = [c.call_id for c in carried]
    assert all(CARRIED_CALL_ID.fullmatch(i) and id_problem(i) is None for i in out)  # wire ids too
    assert len(set(out)) == len(out) and not set(out) & taken
    before: set[str] = set(taken)
    for given_id, kept in zip(ids, out, strict=True):
        if CARRIED_CALL_ID.fullmatch(given_id) and given_id not in before:
            assert kept == given_id
        before.add(kept)
    if out == ids:
        assert carried is calls  # nothing renamed: the provider's tuple itself, no copy


def test_a_provider_id_equal_to_the_one_derived_for_a_later_call_is_still_unique() -> None:
    derived = derive_id("req-1", "call", "1")
    calls = (ToolCall(derived, "t", "{}"), ToolCall("", "t", "{}"))
    out = [c.call_id for c in carried_calls("req-1", calls, frozenset())]
    assert out[0] == derived and out[1] != derived and CARRIED_CALL_ID.fullmatch(out[1])


def test_an_id_another_provider_refuses_is_renamed_and_the_call_still_answered() -> None:
    # A Kimi-style id (a dot and a colon) and one of 41 characters: wire ids both, but
    # Anthropic and Bedrock refuse the first and OpenAI the second once the thread moves there.
    _, body, _, answers = one_turn(["functions.search:0", "c" * 41, "c" * 40])
    ids = [c.call_id for c in body.tool_calls]
    assert ids[0] != "functions.search:0" and ids[1] != "c" * 41 and ids[2] == "c" * 40
    assert all(CARRIED_CALL_ID.fullmatch(i) for i in ids)
    assert [r.disposition for r in answers.receipts] == ["applied"] * 3


def test_a_child_does_not_name_a_call_as_the_one_that_spawned_it_or_one_it_inherited() -> None:
    """Found in review: a child's inherited calls and its spawn call are not among the ids it
    answered itself, so a provider saying `call_0` at every turn repeated them in its history
    (refused by Anthropic), and the fold took the child's own spawn_thread call for the one
    that spawned it ("you are the child thread this call already spawned")."""
    store = MemoryStore()
    (request,) = step(store, [StepRecord(envelope("m-create", create(initial="go")), 0, 0)]).completions
    spawning = NamingModel(["call_0"], name="spawn_thread", arguments={"instructions": "help"})
    body = serve(store, spawning, request)
    assert [c.call_id for c in body.tool_calls] == ["call_0"]
    out = step(store, [StepRecord(envelope(request.request_id, body, "processor"), 0, 1)])
    (creation,) = [loop for loop in out.loopbacks if loop.thread_id != "t1"]
    child = creation.thread_id
    out = step(store, [StepRecord(creation, 0, 2)])
    (child_request,) = out.completions
    state = load_state(store, child)
    assert state is not None and state.config.parent is not None
    assert state.config.parent.spawn_call_id == "call_0" and "call_0" not in state.answered_calls
    history = tuple(read_entries(store, child))
    assert "call_0" in held_call_ids(state, history)
    body = serve(store, NamingModel(["call_0"], name="spawn_thread", arguments={"instructions": "more"}),
                 child_request)
    (renamed,) = body.tool_calls
    assert renamed.call_id != "call_0"
    answer = dataclasses.replace(envelope(child_request.request_id, body, "processor"), thread_id=child)
    step(store, [StepRecord(answer, 0, 3)])
    called = [c.call_id for e in read_entries(store, child) if isinstance(e.body, AssistantEntry)
              for c in e.body.tool_calls]
    assert len(called) == len(set(called))  # no id twice in what the provider is sent
    results = [e.body for e in read_entries(store, child) if isinstance(e.body, ToolResultEntry)]
    assert not any("already spawned" in block.text for r in results for block in r.content
                   if isinstance(block, TextBlock))
