"""`torpor processor` with a real model client: the `anthropic` library against a local server.

The server speaks the Messages API's streaming format (`tests/processors/providers/wire.py`).
The processor runs with `--anthropic-base-url` pointing at it; the echo connector
answers through Kafka.

The conversation: a thread on `anthropic:claude-test` says "please ping"; the model,
after a signed thinking block and a redacted one, calls `echo` three times in one turn
(two valid calls, answered by the connector, and one whose arguments the tool's schema
refuses, answered by the fold with an error result); its second turn answers in text,
and a second user message gets a third. Checked from the outside: the committed texts
and the live deltas streamed before each commit; what the server received (thinking and
signatures sent back, `is_error` per result, the thread's model name, the key from
`--anthropic-api-key-env`); the model and usage each turn records; one receipt per input.

The failures: an overloaded 529, then an `overloaded_error` in the middle of a stream,
are retried (a `completion_retried` event each) and the third attempt commits; a 401
makes an error Completion that parks the thread with the reason, and `unpark` asks again.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Final

import pytest

from tests.processors.provider_kafka import (
    assert_one_receipt_each,
    serving,
    squashed,
    start_agent,
    stop_cleanly,
    streamed_turns,
    tailed_turns,
    thread_events,
    wait_for,
)
from tests.processors.providers import wire
from tests.processors.test_processor import (
    Deployment,
    _input,
    deployment,
)
from torpor.processors.models.providers.mapping_anthropic import REDACTED
from torpor.schemas.records import (
    AssistantEntry,
    Completion,
    Control,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    Usage,
    UserMessage,
)

pytestmark = pytest.mark.kafka

__all__ = ["deployment"]  # the fixture, shared with test_processor

THINKING: Final = "Two texts to echo; the third call is a test of the schema."
SIGNATURE: Final = "EqQBCgIYAhIMa2Fma2Etc2lnbmVkGgxzaWduYXR1cmUtMQ=="
REDACTED_DATA: Final = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"
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
        wire.ant_block_start(1, {"type": "redacted_thinking", "data": REDACTED_DATA}),
        wire.ant_block_stop(1),
        wire.ant_block_start(2, {"type": "text", "text": ""}),
        wire.ant_delta(2, {"type": "text_delta", "text": "Pinging "}),
        {"type": "ping"},
        wire.ant_delta(2, {"type": "text_delta", "text": "twice."}),
        wire.ant_block_stop(2),
        *_tool_use(3, "toolu_ping", '{"text": "ping"}'),
        *_tool_use(4, "toolu_pong", '{"text": ', '"pong"}'),
        *_tool_use(5, "toolu_bad", '{"txt": "no such argument"}'),
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
        wait_for(deployment, lambda: deployment.answers(thread_id) == ANSWERS[:2], "the first two turns")
        deployment.send(_input(thread_id, f"{thread_id}-thanks", 3_000, UserMessage((TextBlock("Thanks!"),))))
        wait_for(deployment, lambda: deployment.answers(thread_id) == ANSWERS, "the third turn")
        stop_cleanly(deployment, processor, echo)
        requests = server.requests

    assert streamed_turns(deployment, thread_id) == [(a, a) for a in ANSWERS]
    tailed = tailed_turns(deployment, thread_id)  # what a person sees
    assert [live for live, _ in tailed] == [squashed(a) for a in ANSWERS]
    assert [answer in shown for answer, (_, shown) in zip(ANSWERS, tailed, strict=True)] == [True] * 3, tailed
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
        {"type": "redacted_thinking", "data": REDACTED_DATA},  # verbatim
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
    assert turns[0].content[:2] == (ThinkingBlock(THINKING, SIGNATURE),
                                    ThinkingBlock("", REDACTED + REDACTED_DATA))
    assert turns[0].tool_calls == (
        ToolCall("toolu_ping", "echo", '{"text": "ping"}'),
        ToolCall("toolu_pong", "echo", '{"text": "pong"}'),
        ToolCall("toolu_bad", "echo", '{"txt": "no such argument"}'),
    )
    dispatched = sorted(d.call_id for d in deployment.dispatches() if d.thread_id == thread_id)
    assert dispatched == ["toolu_ping", "toolu_pong"]  # the refused call never reaches a connector
    assert_one_receipt_each(deployment)
    assert {r.disposition for r in deployment.receipts()} == {"applied"}


def _overloaded_mid_stream() -> list[wire.JSON]:
    return [
        wire.ant_start(),
        wire.ant_block_start(0, {"type": "text", "text": ""}),
        wire.ant_delta(0, {"type": "text_delta", "text": "Partial "}),
        wire.ant_error("overloaded_error", "Overloaded"),
    ]


def test_anthropic_overload_is_retried_and_an_authentication_error_parks_the_thread(
    deployment: Deployment,
) -> None:
    thread_id = f"anthropic-fail-{uuid.uuid4().hex[:8]}"
    replies = [
        wire.json_reply(529, wire.ant_error("overloaded_error", "Overloaded")),
        wire.Reply(body=wire.anthropic_sse(_overloaded_mid_stream())),
        wire.Reply(body=wire.anthropic_sse(wire.ant_text("Recovered after ", "two retries."))),
        wire.json_reply(401, wire.ant_error("authentication_error", "invalid x-api-key")),
        wire.Reply(body=wire.anthropic_sse(wire.ant_text("Back ", "again."))),
    ]
    with serving(replies) as server:
        processor, echo = start_agent(deployment, thread_id, "anthropic:claude-test", "hello",
                                      "--anthropic-base-url", server.url)
        first, last = "Recovered after two retries.", "Back again."
        wait_for(deployment, lambda: deployment.answers(thread_id) == [first], "the turn after two retries")
        again = UserMessage((TextBlock("Once more."),))
        deployment.send(_input(thread_id, f"{thread_id}-again", 3_000, again))
        wait_for(deployment, lambda: any(e.kind == "parked" for e in thread_events(deployment, thread_id)),
                 "parked by the 401")
        unpark = _input(thread_id, f"{thread_id}-unpark", 4_000, Control("unpark", None, None, "key fixed"))
        deployment.send(dataclasses.replace(unpark, source="operator:test"))
        wait_for(deployment, lambda: deployment.answers(thread_id) == [first, last], "the turn after unpark")
        stop_cleanly(deployment, processor, echo)
        requests = [r.body for r in server.requests]

    assert len(requests) == 5
    assert requests[0] == requests[1] == requests[2]  # a retry sends the same request
    assert requests[3] == requests[4]  # unpark asks the same question again
    assert [m["role"] for m in requests[3]["messages"]] == ["user", "assistant", "user"]
    events = thread_events(deployment, thread_id)
    retried = [json.loads(e.data or "{}") for e in events if e.kind == "completion_retried"]
    assert [(r["attempt"], r["retry_in_s"]) for r in retried] == [(1, 0.5), (2, 1.0)]
    assert all("overloaded" in r["error"] for r in retried), retried
    (parked,) = [e for e in events if e.kind == "parked"]
    assert (parked.text or "").startswith(
        "completion_failed:permanent: authentication_error (401): invalid x-api-key"), parked
    # The failed attempt's delta was live output already; the committed turn holds only
    # what the successful attempt said.
    assert streamed_turns(deployment, thread_id) == [
        ("Partial Recovered after two retries.", "Recovered after two retries."),
        ("Back again.", "Back again."),
    ]
    failed = [i.body for i in deployment.inputs()
              if i.thread_id == thread_id and isinstance(i.body, Completion) and i.body.error is not None]
    assert [(c.error.kind, c.error.attempts) for c in failed if c.error] == [("permanent", 1)]
    assert_one_receipt_each(deployment)
    dispositions = [r.disposition for r in deployment.receipts() if r.thread_id == thread_id]
    assert sorted(dispositions) == ["applied"] * 6 + ["parked"], dispositions
