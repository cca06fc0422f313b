"""History -> Messages API messages for every entry kind, and stream events -> one `Finished`."""

from __future__ import annotations

import base64
import json

import pytest
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from tests.processors.providers import wire
from tests.processors.providers.samples import (
    PNG,
    SUMMARY,
    WEATHER,
    assistant,
    event,
    history,
    plain,
    result,
    user,
)
from torpor.processors.models.provider import Finished
from torpor.processors.models.providers.errors import IncompleteStreamError
from torpor.processors.models.providers.mapping_anthropic import (
    EMPTY,
    REDACTED,
    MessageTurn,
    anthropic_messages,
    anthropic_tools,
)
from torpor.processors.models.providers.turns import IMAGE_OMITTED, SUMMARY_HEADER
from torpor.schemas.records import INJECTED_TOOL, TextBlock, ThinkingBlock, ToolCall, Usage

A = ToolCall("call-a", "get_weather", '{"city": "Paris"}')
B = ToolCall("call-b", "get_weather", '{"city": "Rome"}')
EVENTS: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)


def test_user_and_assistant_text_alternate() -> None:
    assert anthropic_messages(history(user("hi"), assistant("hello")), supports_images=True) == [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
    ]


def test_parallel_results_are_one_user_message_with_is_error() -> None:
    entries = history(
        user("weather?"), assistant("", A, B), result("call-a", "sun"), result("call-b", "bad", ok=False)
    )
    messages = anthropic_messages(entries, supports_images=True)
    assert messages[1] == {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "call-a", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "call-b", "name": "get_weather", "input": {"city": "Rome"}},
        ],
    }
    assert messages[2] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "call-a",
                "content": [{"type": "text", "text": "sun"}],
                "is_error": False,
            },
            {
                "type": "tool_result",
                "tool_use_id": "call-b",
                "content": [{"type": "text", "text": "bad"}],
                "is_error": True,
            },
        ],
    }
    assert len(messages) == 3


def test_user_text_after_results_joins_their_message() -> None:
    messages = anthropic_messages(
        history(assistant("", A), result("call-a", "sun"), user("thanks")), supports_images=True
    )
    assert [m["role"] for m in messages] == ["assistant", "user"]
    assert [b["type"] for b in plain(messages)[1]["content"]] == ["tool_result", "text"]


def test_an_event_is_a_tool_use_and_its_tool_result() -> None:
    call, answer = plain(anthropic_messages(history(event()), supports_images=True))
    (use,) = call["content"]
    assert use["type"] == "tool_use" and use["id"] == "ev-1" and use["name"] == INJECTED_TOOL
    assert use["input"]["original_args"] == {"task": "look"}
    assert answer["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "ev-1",
            "is_error": False,
            "content": [{"type": "text", "text": "Report from child thread: done"}],
        }
    ]


def test_a_summary_opens_the_messages() -> None:
    (first,) = anthropic_messages(history(SUMMARY, user("go on")), supports_images=True)
    assert first == {
        "role": "user",
        "content": [
            {"type": "text", "text": f"{SUMMARY_HEADER}\nThe user asked about Paris."},
            {"type": "text", "text": "go on"},
        ],
    }


def test_images_are_base64_blocks_or_a_placeholder() -> None:
    (kept,) = anthropic_messages(history(user("look", PNG)), supports_images=True)
    (replaced,) = anthropic_messages(history(user("look", PNG)), supports_images=False)
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(PNG).decode()},
    }
    assert kept["content"] == [{"type": "text", "text": "look"}, image]
    assert replaced["content"] == [{"type": "text", "text": "look"}, {"type": "text", "text": IMAGE_OMITTED}]


def test_signed_thinking_goes_first_unsigned_is_dropped_redacted_is_restored() -> None:
    signed = assistant("answer", A, thinking=ThinkingBlock("hmm", "sig-1"))
    (message, _) = plain(anthropic_messages(history(signed), supports_images=True))
    assert [b["type"] for b in message["content"]] == ["thinking", "text", "tool_use"]
    assert message["content"][0] == {"type": "thinking", "thinking": "hmm", "signature": "sig-1"}
    (unsigned,) = anthropic_messages(
        history(assistant("x", thinking=ThinkingBlock("hmm", None))), supports_images=True
    )
    assert unsigned["content"] == [{"type": "text", "text": "x"}]
    (redacted,) = anthropic_messages(
        history(assistant("", thinking=ThinkingBlock("", REDACTED + "opaque"))), supports_images=True
    )
    assert redacted["content"] == [{"type": "redacted_thinking", "data": "opaque"}]


def test_empty_content_is_never_sent() -> None:
    (message,) = anthropic_messages(history(user("")), supports_images=True)
    assert message["content"] == [{"type": "text", "text": EMPTY}]


def test_tool_specs_become_input_schemas() -> None:
    assert anthropic_tools((WEATHER,)) == [
        {
            "name": "get_weather",
            "description": WEATHER.description,
            "input_schema": json.loads(WEATHER.parameters),
        }
    ]


def _fold(events: list[wire.JSON]) -> tuple[list[str], MessageTurn]:
    turn = MessageTurn(model="m")
    texts = [t for e in events if e["type"] != "ping" and (t := turn.add(EVENTS.validate_python(e)))]
    return texts, turn


def test_thinking_text_and_tool_use_events_fold_into_one_turn() -> None:
    events = [
        wire.ant_start(input_tokens=30, cache_read=70),
        wire.ant_block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        wire.ant_delta(0, {"type": "thinking_delta", "thinking": "Paris "}),
        wire.ant_delta(0, {"type": "thinking_delta", "thinking": "first."}),
        wire.ant_delta(0, {"type": "signature_delta", "signature": "EqQBCgIYAh"}),
        wire.ant_block_stop(0),
        wire.ant_block_start(1, {"type": "text", "text": ""}),
        wire.ant_delta(1, {"type": "text_delta", "text": "Checking."}),
        wire.ant_block_stop(1),
        wire.ant_block_start(2, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}),
        wire.ant_delta(2, {"type": "input_json_delta", "partial_json": '{"city": '}),
        wire.ant_delta(2, {"type": "input_json_delta", "partial_json": '"Paris"}'}),
        wire.ant_block_stop(2),
        *wire.ant_end("tool_use", 40),
    ]
    texts, turn = _fold(events)
    assert texts == ["Checking."]
    assert turn.finished() == Finished(
        (ThinkingBlock("Paris first.", "EqQBCgIYAh"), TextBlock("Checking.")),
        (ToolCall("toolu_1", "get_weather", '{"city": "Paris"}'),),
        Usage(100, 40, 140),
        wire.ANT_MODEL,
    )


def test_input_counts_in_the_last_message_delta_replace_those_of_message_start() -> None:
    end, stop = wire.ant_end("end_turn", 12)
    # Cumulative counts; a null one (the cache write here) keeps message_start's value.
    end["usage"].update(input_tokens=45, cache_creation_input_tokens=None, cache_read_input_tokens=80)
    events = [wire.ant_start(input_tokens=30, cache_read=70), *wire.ant_text("Hi.")[1:-2], end, stop]
    events[0]["message"]["usage"]["cache_creation_input_tokens"] = 5
    _, turn = _fold(events)
    assert turn.finished().usage == Usage(45 + 5 + 80, 12, 45 + 5 + 80 + 12)


def test_redacted_thinking_is_kept_for_the_next_request() -> None:
    events = [
        wire.ant_start(),
        wire.ant_block_start(0, {"type": "redacted_thinking", "data": "opaque"}),
        wire.ant_block_stop(0),
        *wire.ant_end("end_turn", 3),
    ]
    _, turn = _fold(events)
    assert turn.finished().content == (ThinkingBlock("", REDACTED + "opaque"),)


def test_a_stream_without_message_stop_is_incomplete() -> None:
    _, turn = _fold(wire.ant_text("half")[:-1])
    with pytest.raises(IncompleteStreamError):
        turn.finished()
