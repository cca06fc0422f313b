"""History -> Converse messages for every entry kind, and ConverseStream events -> one `Finished`."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import pytest

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
from torpor.processors.models.providers.mapping_bedrock import (
    BLANK,
    OPEN_SCHEMA,
    OPENING,
    REDACTED,
    UNGRANTED,
    ConverseTurn,
    converse_messages,
    converse_tools,
)
from torpor.processors.models.providers.turns import IMAGE_OMITTED, NO_RESULT, SUMMARY_HEADER
from torpor.schemas.records import (
    INJECTED_TOOL,
    AssistantEntry,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    Usage,
    UserEntry,
)

A = ToolCall("call-a", "get_weather", '{"city": "Paris"}')
B = ToolCall("call-b", "get_weather", '{"city": "Rome"}')


def _messages(*bodies: Any, supports_images: bool = True) -> Any:
    return converse_messages(history(*bodies), supports_images)


def test_user_and_assistant_text_alternate() -> None:
    assert _messages(user("hi"), assistant("hello")) == [
        {"role": "user", "content": [{"text": "hi"}]},
        {"role": "assistant", "content": [{"text": "hello"}]},
    ]


def test_parallel_calls_and_their_results_with_an_error_status() -> None:
    messages = _messages(
        user("weather?"), assistant("", A, B), result("call-a", "sun"), result("call-b", "bad", ok=False)
    )
    assert messages[1] == {
        "role": "assistant",
        "content": [
            {"toolUse": {"toolUseId": "call-a", "name": "get_weather", "input": {"city": "Paris"}}},
            {"toolUse": {"toolUseId": "call-b", "name": "get_weather", "input": {"city": "Rome"}}},
        ],
    }
    assert messages[2] == {
        "role": "user",
        "content": [
            {"toolResult": {"toolUseId": "call-a", "content": [{"text": "sun"}], "status": "success"}},
            {"toolResult": {"toolUseId": "call-b", "content": [{"text": "bad"}], "status": "error"}},
        ],
    }
    assert len(messages) == 3


def test_a_call_without_a_recorded_result_is_answered_with_an_error() -> None:
    _, _, answer = _messages(assistant("", A))
    assert answer["content"] == [
        {"toolResult": {"toolUseId": "call-a", "content": [{"text": NO_RESULT}], "status": "error"}}
    ]


def test_malformed_arguments_are_shown_under_one_key() -> None:
    (_, call, _) = _messages(assistant("", ToolCall("call-x", "get_weather", "{not json")))
    assert call["content"][0]["toolUse"]["input"] == {"invalid_arguments": "{not json"}


def test_user_text_after_results_joins_their_message() -> None:
    messages = _messages(user("q"), assistant("", A), result("call-a", "sun"), user("thanks"))
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert [next(iter(b)) for b in messages[2]["content"]] == ["toolResult", "text"]


def test_a_history_that_opens_with_an_assistant_turn_gets_a_user_message_first() -> None:
    messages = _messages(event(), user("and?"))
    assert messages[0] == {"role": "user", "content": [{"text": OPENING}]}
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]


def test_an_event_is_a_tool_use_and_its_tool_result() -> None:
    _, call, answer = plain(_messages(event()))
    (use,) = call["content"]
    assert use["toolUse"]["toolUseId"] == "ev-1" and use["toolUse"]["name"] == INJECTED_TOOL
    assert use["toolUse"]["input"] == {
        "original_tool_name": "spawn_thread",
        "original_tool_call_id": "call-spawn",
        "original_args": {"task": "look"},
    }
    assert answer == {
        "role": "user",
        "content": [
            {
                "toolResult": {
                    "toolUseId": "ev-1",
                    "content": [{"text": "Report from child thread: done"}],
                    "status": "success",
                }
            }
        ],
    }


def test_a_summary_opens_the_messages() -> None:
    (first,) = _messages(SUMMARY, user("go on"))
    assert first == {
        "role": "user",
        "content": [{"text": f"{SUMMARY_HEADER}\nThe user asked about Paris."}, {"text": "go on"}],
    }


def test_images_are_raw_bytes_or_a_placeholder() -> None:
    (kept,) = _messages(user("look", PNG))
    (replaced,) = _messages(user("look", PNG), supports_images=False)
    assert kept["content"] == [{"text": "look"}, {"image": {"format": "png", "source": {"bytes": PNG}}}]
    assert replaced["content"] == [{"text": "look"}, {"text": IMAGE_OMITTED}]
    (odd,) = _messages(UserEntry((ImageBlock("image/tiff", b"II*"),), interrupt=False))
    assert odd["content"] == [{"text": "[image of unsupported type image/tiff omitted]"}]


def test_an_image_in_a_tool_result_stays_an_image() -> None:
    text = result("call-a", "the screen")
    shot = dataclasses.replace(text, content=(*text.content, ImageBlock("image/jpeg", b"jpg")))
    (_, _, answer) = _messages(user("q"), assistant("", A), shot)
    content = answer["content"][0]["toolResult"]["content"]
    assert content == [{"text": "the screen"}, {"image": {"format": "jpeg", "source": {"bytes": b"jpg"}}}]


def test_signed_reasoning_goes_first_unsigned_is_dropped_redacted_is_restored() -> None:
    (_, message, _) = _messages(user("q"), assistant("answer", A, thinking=ThinkingBlock("hmm", "sig-1")))
    assert [next(iter(b)) for b in message["content"]] == ["reasoningContent", "text", "toolUse"]
    assert message["content"][0] == {
        "reasoningContent": {"reasoningText": {"text": "hmm", "signature": "sig-1"}}
    }
    (_, unsigned) = _messages(user("q"), assistant("x", thinking=ThinkingBlock("hmm", None)))
    assert unsigned["content"] == [{"text": "x"}]
    opaque = base64.b64encode(b"\x00opaque").decode()
    (_, redacted) = _messages(user("q"), assistant("", thinking=ThinkingBlock("", REDACTED + opaque)))
    assert redacted["content"] == [{"reasoningContent": {"redactedContent": b"\x00opaque"}}]


def test_blank_content_is_never_sent() -> None:
    (message,) = _messages(user(""))
    assert message["content"] == [{"text": BLANK}]
    (_, _, answer) = _messages(user("q"), assistant("", A), result("call-a", ""))
    assert answer["content"][0]["toolResult"]["content"] == [{"text": BLANK}]


def test_tool_specs_become_a_tool_config() -> None:
    assert converse_tools((WEATHER,), []) == {
        "tools": [
            {
                "toolSpec": {
                    "name": "get_weather",
                    "description": WEATHER.description,
                    "inputSchema": {"json": json.loads(WEATHER.parameters)},
                }
            }
        ]
    }
    assert converse_tools((), _messages(user("hi"))) is None
    undescribed = converse_tools((dataclasses.replace(WEATHER, description=""),), [])
    assert undescribed is not None and "description" not in undescribed["tools"][0]["toolSpec"]


def test_calls_in_history_are_declared_when_the_thread_grants_no_tools() -> None:
    # Converse refuses toolUse blocks in a request without a toolConfig.
    config = converse_tools((), _messages(event(), assistant("", A), result("call-a", "sun")))
    assert config is not None
    assert [(t["toolSpec"]["name"], t["toolSpec"]["description"]) for t in config["tools"]] == [
        (INJECTED_TOOL, UNGRANTED),
        ("get_weather", UNGRANTED),
    ]
    assert all(t["toolSpec"]["inputSchema"] == {"json": OPEN_SCHEMA} for t in config["tools"])


def test_a_tool_spec_whose_parameters_are_not_json_is_refused() -> None:
    bad = dataclasses.replace(WEATHER, parameters="{")
    with pytest.raises(ValueError):
        converse_tools((bad,), [])


# --- stream events, as boto3 yields them ---------------------------------------------


def _delta(index: int, delta: dict[str, Any]) -> Any:
    return {"contentBlockDelta": {"contentBlockIndex": index, "delta": delta}}


def _use(index: int, call_id: str, name: str) -> Any:
    return {
        "contentBlockStart": {
            "contentBlockIndex": index,
            "start": {"toolUse": {"toolUseId": call_id, "name": name}},
        }
    }


def _fold(events: list[Any]) -> tuple[list[str], ConverseTurn]:
    turn = ConverseTurn(model="bedrock:m")
    return [t for e in events if (t := turn.add(e))], turn


END: Any = [
    {"messageStop": {"stopReason": "tool_use"}},
    {
        "metadata": {
            "usage": {"inputTokens": 30, "outputTokens": 40, "totalTokens": 140, "cacheReadInputTokens": 70},
            "metrics": {"latencyMs": 9},
        }
    },
]


def test_reasoning_text_and_tool_use_events_fold_into_one_turn() -> None:
    events = [
        {"messageStart": {"role": "assistant"}},
        _delta(0, {"reasoningContent": {"text": "Paris "}}),
        _delta(0, {"reasoningContent": {"text": "first."}}),
        _delta(0, {"reasoningContent": {"signature": "EqQBCgIYAh"}}),
        {"contentBlockStop": {"contentBlockIndex": 0}},
        _delta(1, {"text": "Checking."}),
        {"contentBlockStop": {"contentBlockIndex": 1}},
        _use(2, "t1", "get_weather"),
        _delta(2, {"toolUse": {"input": '{"city": '}}),
        _delta(2, {"toolUse": {"input": '"Paris"}'}}),
        {"contentBlockStop": {"contentBlockIndex": 2}},
        _use(3, "t2", "now"),
        {"contentBlockStop": {"contentBlockIndex": 3}},
        *END,
    ]
    texts, turn = _fold(events)
    assert texts == ["Checking."]
    assert turn.finished() == Finished(
        (ThinkingBlock("Paris first.", "EqQBCgIYAh"), TextBlock("Checking.")),
        (ToolCall("t1", "get_weather", '{"city": "Paris"}'), ToolCall("t2", "now", "{}")),
        Usage(100, 40, 140),
        "bedrock:m",
    )


def test_a_finished_turn_goes_back_exactly_as_it_came() -> None:
    events = [
        _delta(0, {"reasoningContent": {"text": "hmm"}}),
        _delta(0, {"reasoningContent": {"signature": "sig"}}),
        _delta(1, {"reasoningContent": {"redactedContent": b"\x01\x02"}}),
        _delta(2, {"text": "Both."}),
        _use(3, "t1", "get_weather"),
        _delta(3, {"toolUse": {"input": '{"city": "Rome"}'}}),
        *END,
    ]
    _, turn = _fold(events)
    done = turn.finished()
    (_, sent, _) = _messages(user("q"), AssistantEntry(done.content, done.tool_calls, done.model, done.usage))
    assert sent["content"] == [
        {"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "sig"}}},
        {"reasoningContent": {"redactedContent": b"\x01\x02"}},
        {"text": "Both."},
        {"toolUse": {"toolUseId": "t1", "name": "get_weather", "input": {"city": "Rome"}}},
    ]


def test_a_stream_without_message_stop_is_incomplete() -> None:
    _, turn = _fold([{"messageStart": {"role": "assistant"}}, _delta(0, {"text": "half"})])
    with pytest.raises(IncompleteStreamError):
        turn.finished()
