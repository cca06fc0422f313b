"""The provider-neutral conversation: grouping, event pairs, dangling and orphan results, images."""

from __future__ import annotations

import json

from tests.processors.providers.samples import SUMMARY, assistant, event, history, result, user
from torpor.processors.models.providers.turns import (
    IMAGE_OMITTED,
    NO_RESULT,
    SUMMARY_HEADER,
    Answered,
    Result,
    Results,
    Said,
    conversation,
)
from torpor.schemas.records import INJECTED_TOOL, ImageBlock, TextBlock, ToolCall

A = ToolCall("call-a", "get_weather", '{"city": "Paris"}')
B = ToolCall("call-b", "get_weather", '{"city": "Rome"}')


def test_parallel_results_are_one_group_in_call_order() -> None:
    turns = conversation(
        history(user("hi"), assistant("", A, B), result("call-b", "rain"), result("call-a", "sun")),
        supports_images=True,
    )
    assert turns == (
        Said((TextBlock("hi"),)),
        Answered((), (A, B)),
        Results(
            (
                Result("call-a", "get_weather", True, (TextBlock("sun"),)),
                Result("call-b", "get_weather", True, (TextBlock("rain"),)),
            )
        ),
    )


def test_an_event_becomes_a_synthetic_call_and_its_result() -> None:
    (call_turn, result_turn) = conversation(history(event()), supports_images=True)
    assert isinstance(call_turn, Answered) and isinstance(result_turn, Results)
    (call,) = call_turn.tool_calls
    assert (call.call_id, call.name) == ("ev-1", INJECTED_TOOL)
    assert json.loads(call.arguments) == {
        "original_tool_name": "spawn_thread",
        "original_tool_call_id": "call-spawn",
        "original_args": {"task": "look"},
    }
    assert result_turn.results == (
        Result("ev-1", INJECTED_TOOL, True, (TextBlock("Report from child thread: done"),)),
    )


def test_an_event_among_open_calls_is_shown_after_their_results() -> None:
    turns = conversation(
        history(assistant("", A, B), result("call-a", "sun"), event(), result("call-b", "rain")),
        supports_images=True,
    )
    kinds = [
        (type(t).__name__, [c.call_id for c in t.tool_calls] if isinstance(t, Answered) else None)
        for t in turns
    ]
    assert kinds == [
        ("Answered", ["call-a", "call-b"]),
        ("Results", None),
        ("Answered", ["ev-1"]),
        ("Results", None),
    ]


def test_a_call_without_a_result_is_answered_with_an_error() -> None:
    turns = conversation(history(assistant("", A), user("still there?")), supports_images=True)
    assert turns[1] == Results((Result("call-a", "get_weather", False, (TextBlock(NO_RESULT),)),))
    assert turns[2] == Said((TextBlock("still there?"),))


def test_a_result_whose_call_is_not_visible_becomes_user_text() -> None:
    (turn,) = conversation(history(result("call-gone", "boom", ok=False)), supports_images=True)
    assert isinstance(turn, Said)
    note = turn.content[0]
    assert isinstance(note, TextBlock) and "error of tool call get_weather (call-gone)" in note.text


def test_a_summary_starts_the_conversation() -> None:
    (turn,) = conversation(history(SUMMARY), supports_images=True)
    assert turn == Said((TextBlock(f"{SUMMARY_HEADER}\nThe user asked about Paris."),))


def test_images_are_replaced_for_a_model_without_image_input() -> None:
    (kept,) = conversation(history(user("look", b"png")), supports_images=True)
    (replaced,) = conversation(history(user("look", b"png")), supports_images=False)
    assert kept == Said((TextBlock("look"), ImageBlock("image/png", b"png")))
    assert replaced == Said((TextBlock("look"), TextBlock(IMAGE_OMITTED)))
