"""`torpor processor` with a real model client: the `anthropic` library against a local server.

The server speaks the Messages API's streaming format (`tests/processors/providers/wire.py`).
A thread whose model is `anthropic:claude-test` says "please ping" and the model, after
a signed thinking block, calls `echo` three times in one turn: two valid calls, which the
echo connector answers through Kafka, and one with arguments the tool's schema refuses,
which the fold answers with an error result. The second turn answers in text; a second
user message gets a third. The processor runs with `--anthropic-base-url` pointing at the
server and its key in a variable named by `--anthropic-api-key-env`.

Checked from the outside: the texts the turns committed and the live deltas streamed
before each commit; what the server received (the thinking block and its signature sent
back, every result with its `is_error`, the model name, the key); the model and usage
each turn records; one receipt per input.
"""

from __future__ import annotations

import uuid
from typing import Final

import pytest

from tests.processors.provider_kafka import serving, start_agent, stop_cleanly, streamed_turns, thread_events
from tests.processors.providers import wire
from tests.processors.test_processor import (
    Deployment,
    _assert_one_receipt_per_input,
    _input,
    deployment,
)
from tests.waiting import wait_until
from torpor.schemas.records import AssistantEntry, TextBlock, ThinkingBlock, ToolCall, Usage, UserMessage

pytestmark = pytest.mark.kafka

__all__ = ["deployment"]  # the fixture, shared with test_processor

THINKING: Final = "Two texts to echo; the third call is a test of the schema."
SIGNATURE: Final = "EqQBCgIYAhIMa2Fma2Etc2lnbmVkGgxzaWduYXR1cmUtMQ=="
KEY_VARIABLE: Final = "TORPOR_TEST_ANTHROPIC_KEY"
KEY: Final = "sk-ant-kafka-test"
ANSWERS: Final = ["Pinging twice.", "The echoes said ping and pong.", "You are welcome."]


def _tool_use(index: int, call_id: str, *json_parts: str) -> list[wire.JSON]:
    return [
        wire.ant_block_start(index, {"type": "tool_use", "id": call_id, "name": "echo", "input": {}}),
        *(wire.ant_delta(index, {"type": "input_json_delta", "partial_json": p}) for p in json_parts),
        wire.ant_block_stop(index),
    ]


def _thinking_then_three_calls() -> list[wire.JSON]:
    return [
        wire.ant_start(input_tokens=120, cache_read=30),
        wire.ant_block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        wire.ant_delta(0, {"type": "thinking_delta", "thinking": THINKING}),
        wire.ant_delta(0, {"type": "signature_delta", "signature": SIGNATURE}),
        wire.ant_block_stop(0),
        wire.ant_block_start(1, {"type": "text", "text": ""}),
        wire.ant_delta(1, {"type": "text_delta", "text": "Pinging "}),
        {"type": "ping"},
        wire.ant_delta(1, {"type": "text_delta", "text": "twice."}),
        wire.ant_block_stop(1),
        *_tool_use(2, "toolu_ping", '{"text": "ping"}'),
        *_tool_use(3, "toolu_pong", '{"text": ', '"pong"}'),
        *_tool_use(4, "toolu_bad", '{"txt": "no such argument"}'),
        *wire.ant_end("tool_use", 90),
    ]


def _replies() -> list[wire.Reply]:
    return [
        wire.Reply(body=wire.anthropic_sse(_thinking_then_three_calls())),
        wire.Reply(body=wire.anthropic_sse(wire.ant_text("The echoes said ", "ping and pong."))),
        wire.Reply(body=wire.anthropic_sse(wire.ant_text("You are ", "welcome."))),
    ]


def _results(message: wire.JSON) -> dict[str, tuple[bool, str]]:
    """A user message's tool results: call id -> (is_error, its text)."""
    assert message["role"] == "user"
    return {
        block["tool_use_id"]: (block["is_error"], " ".join(part["text"] for part in block["content"]))
        for block in message["content"]
        if block["type"] == "tool_result"
    }


def test_an_anthropic_model_completes_a_multi_turn_tool_calling_conversation_in_kafka_mode(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread_id = f"anthropic-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(KEY_VARIABLE, KEY)  # the processor's environment is the test's
    with serving(_replies()) as server:
        processor, echo = start_agent(deployment, thread_id, "anthropic:claude-test", "please ping",
                                      "--anthropic-base-url", server.url,
                                      "--anthropic-api-key-env", KEY_VARIABLE)
        wait_until(lambda: deployment.answers(thread_id) == ANSWERS[:2], timeout=120,
                   message=f"the first two turns; processor log:\n{deployment.log('processor')[-3000:]}")
        deployment.send(_input(thread_id, f"{thread_id}-thanks", 3_000, UserMessage((TextBlock("Thanks!"),))))
        wait_until(lambda: deployment.answers(thread_id) == ANSWERS, timeout=120,
                   message=f"the third turn; processor log:\n{deployment.log('processor')[-3000:]}")
        stop_cleanly(deployment, processor, echo)
        requests = server.requests

    assert streamed_turns(deployment, thread_id) == [(a, a) for a in ANSWERS]
    assert [r.path for r in requests] == ["/v1/messages"] * 3
    assert {r.body["model"] for r in requests} == {"claude-test"}  # the thread's name, not the reported one
    assert {r.headers["authorization"] for r in requests} == {f"Bearer {KEY}"}  # from KEY_VARIABLE
    first, second, third = (r.body for r in requests)
    assert first["messages"] == [{"role": "user", "content": [{"type": "text", "text": "please ping"}]}]
    assert first["system"] == "You are a test agent." and first["stream"] is True
    assert "echo" in [t["name"] for t in first["tools"]]

    user, assistant, results = second["messages"]
    assert user == first["messages"][0]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == [
        {"type": "thinking", "thinking": THINKING, "signature": SIGNATURE},  # first, as the API requires
        {"type": "text", "text": "Pinging twice."},
        {"type": "tool_use", "id": "toolu_ping", "name": "echo", "input": {"text": "ping"}},
        {"type": "tool_use", "id": "toolu_pong", "name": "echo", "input": {"text": "pong"}},
        {"type": "tool_use", "id": "toolu_bad", "name": "echo", "input": {"txt": "no such argument"}},
    ]
    answered = _results(results)
    assert answered.keys() == {"toolu_ping", "toolu_pong", "toolu_bad"}
    assert answered["toolu_ping"] == (False, "echo: ping")
    assert answered["toolu_pong"] == (False, "echo: pong")
    is_error, why = answered["toolu_bad"]
    assert is_error and why.startswith("Error: invalid arguments for tool 'echo'"), why

    # The third request carries the whole conversation, thinking included, roles alternating.
    assert third["messages"][:3] == second["messages"]
    assert [m["role"] for m in third["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert third["messages"][3]["content"] == [{"type": "text", "text": "The echoes said ping and pong."}]
    assert third["messages"][4]["content"] == [{"type": "text", "text": "Thanks!"}]

    committed = [e.entry.body for e in thread_events(deployment, thread_id)
                 if e.kind == "turn_committed" and e.entry is not None]
    turns = [body for body in committed if isinstance(body, AssistantEntry)]
    assert [t.model for t in turns] == [f"anthropic:{wire.ANT_MODEL}"] * 3
    # Input tokens count cache reads; output tokens are the last message_delta's.
    assert [t.usage for t in turns] == [Usage(150, 90, 240), Usage(25, 15, 40), Usage(25, 15, 40)]
    assert turns[0].content[0] == ThinkingBlock(THINKING, SIGNATURE)
    assert turns[0].tool_calls == (
        ToolCall("toolu_ping", "echo", '{"text": "ping"}'),
        ToolCall("toolu_pong", "echo", '{"text": "pong"}'),
        ToolCall("toolu_bad", "echo", '{"txt": "no such argument"}'),
    )
    dispatched = sorted(d.call_id for d in deployment.dispatches() if d.thread_id == thread_id)
    assert dispatched == ["toolu_ping", "toolu_pong"]  # the refused call never reaches a connector
    _assert_one_receipt_per_input(deployment)
    assert {r.disposition for r in deployment.receipts()} == {"applied"}
