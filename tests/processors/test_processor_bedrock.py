"""`torpor processor` with Bedrock: real boto3 (`converse_stream`) against a local server.

The server writes Bedrock's eventstream frames (`tests/processors/providers/bedrock_wire.py`).
A thread on `bedrock:<model id>` asks for `echo` in its first turn (text, then a toolUse
whose JSON input arrives in two pieces) and answers with text in its second; the
processor runs with `--bedrock-region` and `--bedrock-endpoint-url` pointing at the
server and dummy credentials from boto3's chain; the echo connector answers through
Kafka, and a `torpor tail` started before the first completion shows both turns.
"""

from __future__ import annotations

import json
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
from tests.processors.providers import bedrock_wire as bw
from tests.processors.test_processor import Deployment, deployment

pytestmark = pytest.mark.kafka

__all__ = ["deployment"]  # the fixture, shared with test_processor

ANSWERS = ["Pinging.", "The echo said ping."]


def _tool_call() -> list[bytes]:
    return [bw.cv_start(), bw.cv_delta(0, {"text": "Pinging."}), bw.cv_stop(0),
            *bw.cv_tool(1, "call_1", '{"text": ', '"ping"}', name="echo"), *bw.cv_end("tool_use")]


def test_a_bedrock_model_completes_a_tool_calling_turn_in_kafka_mode(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    bw.client_environment(monkeypatch)  # the processor's environment is the test's
    thread_id = f"bedrock-{uuid.uuid4().hex[:8]}"
    replies = [bw.stream(_tool_call()), bw.stream(bw.cv_text("The echo ", "said ping."))]
    with serving(replies) as server:
        processor, echo = start_agent(deployment, thread_id, f"bedrock:{bw.MODEL}", "please ping",
                                      "--bedrock-region", bw.REGION, "--bedrock-endpoint-url", server.url)
        wait_for(deployment, lambda: deployment.answers(thread_id) == ANSWERS, "both turns")
        stop_cleanly(deployment, processor, echo)
        first, second = server.requests

    assert first.path == "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse-stream"
    assert first.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=testing/")
    assert first.body["toolConfig"]["tools"][0]["toolSpec"]["name"] == "echo"
    call, result = second.body["messages"][-2:]
    assert {"toolUse": {"toolUseId": "call_1", "name": "echo", "input": {"text": "ping"}}} in call["content"]
    (answered,) = [block["toolResult"] for block in result["content"] if "toolResult" in block]
    assert answered["toolUseId"] == "call_1" and "echo: ping" in json.dumps(answered["content"])
    assert answered.get("status", "success") == "success"

    assert streamed_turns(deployment, thread_id) == [(a, a) for a in ANSWERS]
    tailed = tailed_turns(deployment, thread_id)  # what a person watching `torpor tail` saw, live
    assert [live for live, _ in tailed] == [squashed(a) for a in ANSWERS]
    assert [line for _, line in tailed] == ['Pinging. | calls echo({"text": "ping"})', "The echo said ping."]
    assert_one_receipt_each(deployment)
    assert {r.disposition for r in deployment.receipts()} == {"applied"}
