"""The scripted model: rules by thread, kind and recent text; repeatable; failures on cue."""

from __future__ import annotations

import asyncio

import pytest

from torpor.processors.models.provider import (
    EXHAUSTED,
    REMEMBERED_REQUESTS,
    CompletionRequest,
    Finished,
    ModelOutput,
    PermanentModelError,
    ScriptedCall,
    ScriptedModel,
    ScriptedTurn,
    ScriptRule,
    TextDelta,
    TransientModelError,
    recent_text,
)
from torpor.schemas.records import (
    AssistantEntry,
    HistoryEntry,
    ParentLink,
    TextBlock,
    ToolResultEntry,
    Usage,
    UserEntry,
)


def said(seq: int, text: str) -> HistoryEntry:
    return HistoryEntry(seq, seq, f"m{seq}", UserEntry((TextBlock(text),), False))


def request(
    request_id: str, thread: str = "t", history: tuple[HistoryEntry, ...] = (), kind: str | None = None
) -> CompletionRequest:
    parent = ParentLink("root", "root", "c", kind, 1) if kind else None
    return CompletionRequest(request_id, thread, "scripted", "sys", history, (), parent)


def collect(model: ScriptedModel, req: CompletionRequest) -> list[ModelOutput]:
    async def run() -> list[ModelOutput]:
        return [out async for out in model.complete(req)]

    return asyncio.run(run())


def test_a_rule_walks_its_turns_per_thread_and_streams_the_chunks() -> None:
    rule = ScriptRule(turns=(ScriptedTurn(chunks=("he", "llo")), ScriptedTurn(chunks=("again",))))
    model = ScriptedModel([rule])
    first = collect(model, request("r1"))
    assert first[:2] == [TextDelta("he"), TextDelta("llo")]
    assert isinstance(first[-1], Finished) and first[-1].content == (TextBlock("hello"),)
    second = collect(model, request("r2"))
    assert isinstance(second[-1], Finished) and second[-1].content == (TextBlock("again"),)
    other_thread = collect(model, request("r3", thread="u"))
    assert isinstance(other_thread[-1], Finished) and other_thread[-1].content == (TextBlock("hello"),)
    assert model.turn_for(request("r4")) == EXHAUSTED


def test_the_same_request_id_gets_the_same_turn() -> None:
    model = ScriptedModel([ScriptRule(turns=(ScriptedTurn(chunks=("a",)), ScriptedTurn(chunks=("b",))))])
    assert collect(model, request("r1")) == collect(model, request("r1"))


def test_only_the_latest_request_ids_are_remembered() -> None:
    first, second = ScriptedTurn(chunks=("a",)), ScriptedTurn(chunks=("b",))
    model = ScriptedModel([ScriptRule(turns=(first, second))])
    assert model.turn_for(request("r-0")) == first
    for i in range(1, REMEMBERED_REQUESTS):  # other threads: the cursor of thread "t" stays
        model.turn_for(request(f"r-{i}", thread=f"u{i}"))
    assert model.turn_for(request("r-0")) == first  # still remembered: the same turn
    for i in range(REMEMBERED_REQUESTS, 2 * REMEMBERED_REQUESTS):
        model.turn_for(request(f"r-{i}", thread=f"u{i}"))
    assert model.turn_for(request("r-0")) == second  # forgotten: answered as a new request


def test_rules_match_on_thread_kind_and_recent_text() -> None:
    child = ScriptRule(turns=(ScriptedTurn(chunks=("child",)),), kind="child")
    pinged = ScriptRule(turns=(ScriptedTurn(chunks=("pong",)),), last_contains="ping")
    exact = ScriptRule(turns=(ScriptedTurn(chunks=("mine",)),), thread="special")
    model = ScriptedModel([child, pinged, exact])
    assert model.turn_for(request("a", kind="child")).chunks == ("child",)
    assert model.turn_for(request("b", history=(said(0, "ping me"),))).chunks == ("pong",)
    assert model.turn_for(request("c", thread="special")).chunks == ("mine",)
    assert model.turn_for(request("d")) == EXHAUSTED


def test_recent_text_is_everything_after_the_last_turn() -> None:
    turn = HistoryEntry(1, 1, "m1", AssistantEntry((TextBlock("I will call"),), (), "m", Usage(1, 1, 2)))
    first = HistoryEntry(2, 2, "m2", ToolResultEntry("c1", "x", True, (TextBlock("one"),), "tool"))
    history = (said(0, "old"), turn, first, said(3, "two"))
    assert recent_text(history) == "one\ntwo"
    assert recent_text(history[:2]) == "I will call"


def test_tool_calls_get_ids_derived_from_the_request() -> None:
    rule = ScriptRule(turns=(ScriptedTurn(tool_calls=(ScriptedCall("echo", '{"text":"x"}'),)),))
    out = collect(ScriptedModel([rule]), request("r1"))
    finished = out[-1]
    assert isinstance(finished, Finished)
    (tool_call,) = finished.tool_calls
    assert tool_call.name == "echo" and tool_call.call_id.startswith("tp_")
    assert finished.usage.total_tokens > 0


def test_transient_failures_then_success_and_permanent_failures() -> None:
    flaky = ScriptedModel([ScriptRule(turns=(ScriptedTurn(chunks=("ok",), transient_failures=2),))])
    for _ in range(2):
        with pytest.raises(TransientModelError):
            collect(flaky, request("r1"))
    assert isinstance(collect(flaky, request("r1"))[-1], Finished)
    broken = ScriptedModel([ScriptRule(turns=(ScriptedTurn(permanent_failure=True),))])
    with pytest.raises(PermanentModelError):
        collect(broken, request("r1"))


def test_models_lists_the_scripted_model() -> None:
    (info,) = ScriptedModel([]).models()
    assert info.name == "scripted" and info.context_window > 0 and not info.supports_images
