"""`torpor processor` with a real model client: the `openai` library against a local server.

The server speaks the Chat Completions wire format (`tests/processors/providers/wire.py`,
streamed server-sent events). A thread whose model is `openai:gpt-test` asks for `echo`
in its first turn and answers with text in its second; the processor runs with
`--openai-base-url` pointing at the server, the echo connector answers through Kafka, and
a `torpor tail` started before the first completion shows both turns as they happen.
"""

from __future__ import annotations

import uuid

import pytest

from tests.processors.provider_kafka import (
    assert_one_receipt_each,
    serving,
    squashed,
    start_agent,
    stop_cleanly,
    streamed_turns,
    tailed_turns,
    wait_for,
)
from tests.processors.providers import wire
from tests.processors.test_processor import Deployment, deployment

pytestmark = pytest.mark.kafka

__all__ = ["deployment"]  # the fixture, shared with test_processor


def _tool_call() -> list[wire.JSON]:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "echo", "arguments": ""}}
    return [
        wire.oai_chunk({"role": "assistant", "content": "Pinging.", "tool_calls": [call]}),
        wire.oai_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"text": "ping"}'}}]}),
        wire.oai_chunk({}, "tool_calls"),
        wire.oai_usage(40, 12),
    ]


def test_an_openai_model_completes_a_tool_calling_turn_in_kafka_mode(deployment: Deployment) -> None:
    thread_id = f"openai-{uuid.uuid4().hex[:8]}"
    replies = [wire.Reply(body=wire.openai_sse(_tool_call())),
               wire.Reply(body=wire.openai_sse(wire.oai_text("The echo ", "said ping.")))]
    with serving(replies) as server:
        processor, echo = start_agent(deployment, thread_id, "openai:gpt-test", "please ping",
                                      "--openai-base-url", f"{server.url}/v1")
        wait_for(deployment, lambda: deployment.answers(thread_id) == ["Pinging.", "The echo said ping."],
                 "both turns")
        first, second = server.requests
        assert first.path == "/v1/chat/completions" and first.body["model"] == "gpt-test"
        assert first.body["tools"][0]["function"]["name"] == "echo"
        tool_message = second.body["messages"][-1]
        assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_1"
        assert "echo: ping" in str(tool_message["content"])
        stop_cleanly(deployment, processor, echo)

    answers = ["Pinging.", "The echo said ping."]
    assert streamed_turns(deployment, thread_id) == [(a, a) for a in answers]
    tailed = tailed_turns(deployment, thread_id)  # what a person watching `torpor tail` saw, live
    assert [live for live, _ in tailed] == [squashed(a) for a in answers]
    shown = [line for _, line in tailed]
    assert shown == ['Pinging. | calls echo({"text": "ping"})', "The echo said ping."]
    assert_one_receipt_each(deployment)
    assert {r.disposition for r in deployment.receipts()} == {"applied"}
