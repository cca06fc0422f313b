"""History -> chat completion messages for every entry kind, and chunks -> one `Finished`."""

from __future__ import annotations

import base64
import json

import pytest
from openai.types.chat import ChatCompletionChunk

from tests.processors.providers import wire
from tests.processors.providers.samples import (
    PNG,
    SUMMARY,
    USAGE,
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
from torpor.processors.models.providers.mapping_openai import ChatTurn, chat_messages, chat_tools
from torpor.processors.models.providers.turns import ERROR_PREFIX, IMAGE_OMITTED, SUMMARY_HEADER
from torpor.schemas.records import (
    INJECTED_TOOL,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultEntry,
    Usage,
)

A = ToolCall("call-a", "get_weather", '{"city": "Paris"}')
B = ToolCall("call-b", "get_weather", '{"city": "Rome"}')
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


def test_system_prompt_user_text_and_assistant_text() -> None:
    messages = chat_messages("Be brief.", history(user("hi"), assistant("hello")), supports_images=True)
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]


def test_parallel_calls_and_their_results_with_the_error_prefix() -> None:
    entries = history(
        assistant("checking", A, B), result("call-a", "sun"), result("call-b", "no such city", ok=False)
    )
    assert chat_messages("", entries, supports_images=True) == [
        {
            "role": "assistant",
            "content": "checking",
            "tool_calls": [
                {
                    "id": "call-a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": A.arguments},
                },
                {
                    "id": "call-b",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": B.arguments},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call-a", "content": "sun"},
        {"role": "tool", "tool_call_id": "call-b", "content": ERROR_PREFIX + "no such city"},
    ]


def test_an_event_is_an_assistant_call_and_a_tool_message() -> None:
    call, answer = plain(chat_messages("", history(event()), supports_images=True))
    assert call["role"] == "assistant" and call["content"] is None
    (tool_call,) = call["tool_calls"]
    assert tool_call["id"] == "ev-1" and tool_call["function"]["name"] == INJECTED_TOOL
    assert json.loads(tool_call["function"]["arguments"])["original_tool_call_id"] == "call-spawn"
    assert answer == {"role": "tool", "tool_call_id": "ev-1", "content": "Report from child thread: done"}


def test_a_summary_opens_the_messages_as_user_text() -> None:
    assert chat_messages("", history(SUMMARY, user("go on")), supports_images=True) == [
        {"role": "user", "content": f"{SUMMARY_HEADER}\nThe user asked about Paris."},
        {"role": "user", "content": "go on"},
    ]


def test_user_images_are_data_url_parts_or_a_placeholder() -> None:
    (with_image,) = chat_messages("", history(user("look", PNG)), supports_images=True)
    (without,) = chat_messages("", history(user("look", PNG)), supports_images=False)
    assert with_image == {
        "role": "user",
        "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": PNG_URL}}],
    }
    assert without == {"role": "user", "content": f"look\n{IMAGE_OMITTED}"}


def test_images_in_results_follow_every_tool_message_of_the_group() -> None:
    shot = ToolResultEntry(
        "call-a", "get_weather", True, (TextBlock("map"), ImageBlock("image/png", PNG)), "tool"
    )
    messages = chat_messages(
        "", history(assistant("", A, B), shot, result("call-b", "rain")), supports_images=True
    )
    assert [m["role"] for m in messages] == ["assistant", "tool", "tool", "user"]
    assert plain(messages)[3]["content"][1] == {"type": "image_url", "image_url": {"url": PNG_URL}}


def test_reasoning_is_not_sent_back() -> None:
    entry = assistant("answer", thinking=ThinkingBlock("hmm", "sig"))
    assert chat_messages("", history(entry), supports_images=True) == [
        {"role": "assistant", "content": "answer"}
    ]


def test_tool_specs_become_function_tools() -> None:
    (tool,) = chat_tools((WEATHER,))
    assert tool == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": WEATHER.description,
            "parameters": json.loads(WEATHER.parameters),
        },
    }


def _chunks(payloads: list[wire.JSON]) -> list[ChatCompletionChunk]:
    return [ChatCompletionChunk.model_validate(p) for p in payloads]


def test_chunks_of_parallel_calls_assemble_by_index() -> None:
    turn = ChatTurn(model="m")
    payloads = [
        wire.oai_chunk(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ],
            }
        ),
        wire.oai_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Pa'}}]}),
        wire.oai_chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        wire.oai_chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ris"}'}}]}),
        wire.oai_chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"city": "Rome"}'}}]}),
        wire.oai_chunk({}, "tool_calls"),
        wire.oai_usage(20, 9),
    ]
    assert [turn.add(c) for c in _chunks(payloads)] == [None] * 7
    assert turn.finished("fallback") == Finished(
        (),
        (
            ToolCall("call_1", "get_weather", '{"city": "Paris"}'),
            ToolCall("call_2", "get_weather", '{"city": "Rome"}'),
        ),
        Usage(20, 9, 29),
        wire.OAI_MODEL,
    )


def test_streamed_reasoning_content_is_kept_unsigned() -> None:
    turn = ChatTurn(model="m")
    for chunk in _chunks([wire.oai_chunk({"reasoning_content": "think"}), *wire.oai_text("ok")]):
        turn.add(chunk)
    assert turn.finished("f").content == (ThinkingBlock("think", None), TextBlock("ok"))


def test_a_stream_without_finish_reason_is_incomplete() -> None:
    turn = ChatTurn(model="m")
    for chunk in _chunks([wire.oai_chunk({"content": "half"})]):
        assert turn.add(chunk) == "half"
    with pytest.raises(IncompleteStreamError):
        turn.finished("f")


def test_usage_is_zero_when_the_server_sends_none() -> None:
    turn = ChatTurn(model="m")
    for chunk in _chunks(wire.oai_text("ok")[:-1]):
        turn.add(chunk)
    assert turn.finished("f").usage == Usage(0, 0, 0) != USAGE
