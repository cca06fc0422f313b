"""`BedrockProvider` through the real boto3 client against a local ConverseStream server."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.processors.providers import bedrock_wire as bw
from tests.processors.providers import wire
from tests.processors.providers.samples import WEATHER, collect, history, request, result, run, user
from tests.waiting import wait_until
from torpor.processors.models.provider import (
    CompletionRequest,
    Finished,
    PermanentModelError,
    TextDelta,
    TransientModelError,
)
from torpor.processors.models.providers.bedrock_provider import BedrockProvider, bedrock_client
from torpor.processors.models.providers.errors import (
    IncompleteStreamError,
    RateLimitedError,
    StreamStalledError,
)
from torpor.processors.models.providers.settings import BedrockSettings, EndpointSettings
from torpor.schemas.errors import ConfigError
from torpor.schemas.records import AssistantEntry, TextBlock, ThinkingBlock, ToolCall, Usage

ASK = request(history(user("Weather in Paris?")), model=f"bedrock:{bw.MODEL}", tools=(WEATHER,))


@pytest.fixture(autouse=True)
def _aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    bw.client_environment(monkeypatch)
    yield
    # Every stream's thread ends with its stream, whichever way the stream ended.
    wait_until(lambda: not _stream_threads(), 60, "a stream's thread outlived its test")


def _provider(url: str, **endpoint: Any) -> BedrockProvider:
    settings = BedrockSettings(region=bw.REGION, endpoint=EndpointSettings(base_url=url, **endpoint))
    return BedrockProvider(bedrock_client(settings), bw.MODEL, settings)


async def _complete(
    replies: list[wire.Reply], req: CompletionRequest = ASK, **endpoint: Any
) -> tuple[list[str], Finished, wire.WireServer]:
    async with wire.WireServer(replies) as server:
        deltas, finished = await collect(_provider(server.url, **endpoint).complete(req))
        return deltas, finished, server


def _fails(replies: list[wire.Reply], **endpoint: Any) -> Exception:
    with pytest.raises(Exception) as caught:
        run(_complete(replies, **endpoint))
    return caught.value


def _stream_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("bedrock ")]


def test_the_frames_are_what_botocore_decodes() -> None:
    ((headers, payload),) = bw.decoded([bw.cv_delta(0, {"text": "hi"})])
    assert headers == {
        ":event-type": "contentBlockDelta",
        ":content-type": "application/json",
        ":message-type": "event",
    }
    assert payload == {"contentBlockIndex": 0, "delta": {"text": "hi"}}


def test_a_text_stream_yields_deltas_then_the_turn_with_usage() -> None:
    deltas, finished, server = run(_complete([bw.stream(bw.cv_text("Sunny ", "in Paris."))]))
    assert deltas == ["Sunny ", "in Paris."]
    assert finished == Finished((TextBlock("Sunny in Paris."),), (), Usage(25, 15, 40), f"bedrock:{bw.MODEL}")
    (sent,) = server.requests
    assert (sent.method, sent.path) == (
        "POST",
        "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse-stream",
    )
    # Signed with the chain's credentials, for the configured region and Bedrock's service name.
    assert sent.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=testing/")
    assert f"/{bw.REGION}/bedrock/aws4_request" in sent.headers["authorization"]
    assert sent.body["messages"] == [{"role": "user", "content": [{"text": "Weather in Paris?"}]}]
    assert sent.body["system"] == [{"text": "Be brief."}]
    assert sent.body["toolConfig"]["tools"][0]["toolSpec"]["name"] == "get_weather"
    assert "inferenceConfig" not in sent.body and "additionalModelRequestFields" not in sent.body


def test_a_tool_without_a_description_and_an_empty_system_prompt_pass_boto3s_checks() -> None:
    bare = request(history(user("hi")), system="", tools=(dataclasses.replace(WEATHER, description=""),))
    _, finished, server = run(_complete([bw.stream(bw.cv_text("ok"))], bare))
    assert finished.content == (TextBlock("ok"),)
    assert "system" not in server.requests[0].body


def test_usage_counts_cache_reads_as_input() -> None:
    frames = [
        *bw.cv_text("Hi.")[:-2],
        *bw.cv_end("end_turn", input_tokens=30, output_tokens=4, cache_read=70),
    ]
    _, finished, _ = run(_complete([bw.stream(frames)]))
    assert finished.usage == Usage(100, 4, 104)


def _reasoning_then_two_calls() -> list[bytes]:
    return [
        bw.cv_start(),
        bw.cv_delta(0, {"reasoningContent": {"text": "Two cities, "}}),
        bw.cv_delta(0, {"reasoningContent": {"text": "two calls."}}),
        bw.cv_delta(0, {"reasoningContent": {"signature": "EqQBCgIYAhIM1gbcDa9GJwZA"}}),
        bw.cv_stop(0),
        bw.cv_delta(1, {"reasoningContent": {"redactedContent": base64.b64encode(b"\x00sealed").decode()}}),
        bw.cv_stop(1),
        *bw.cv_tool(2, "tooluse_P", '{"city": ', '"Paris"}'),
        *bw.cv_tool(3, "tooluse_R", '{"city": "Rome"}'),
        *bw.cv_end("tool_use", output_tokens=60),
    ]


def test_reasoning_with_its_signature_and_parallel_tool_use_round_trip() -> None:
    deltas, finished, server = run(
        _complete([bw.stream(_reasoning_then_two_calls())], thinking_budget_tokens=2048)
    )
    assert deltas == []  # reasoning is not live output
    sealed = base64.b64encode(b"\x00sealed").decode()
    assert finished.content == (
        ThinkingBlock("Two cities, two calls.", "EqQBCgIYAhIM1gbcDa9GJwZA"),
        ThinkingBlock("", f"bedrock_redacted:{sealed}"),
    )
    assert finished.tool_calls == (
        ToolCall("tooluse_P", "get_weather", '{"city": "Paris"}'),
        ToolCall("tooluse_R", "get_weather", '{"city": "Rome"}'),
    )
    body = server.requests[0].body
    assert body["additionalModelRequestFields"] == {"thinking": {"type": "enabled", "budget_tokens": 2048}}
    assert body["inferenceConfig"] == {"maxTokens": 2048 + 4096}
    # Committed, answered, and sent back: the signed reasoning first, the calls, one result message.
    turn = AssistantEntry(finished.content, finished.tool_calls, finished.model, finished.usage)
    follow_up = request(
        history(
            user("Weather in Paris?"),
            turn,
            result("tooluse_P", "sun"),
            result("tooluse_R", "no such city", ok=False),
        ),
        model=f"bedrock:{bw.MODEL}",
    )
    _, _, server = run(_complete([bw.stream(bw.cv_text("ok"))], follow_up, thinking_budget_tokens=2048))
    _, sent_turn, sent_results = server.requests[0].body["messages"]
    assert sent_turn == {
        "role": "assistant",
        "content": [
            {
                "reasoningContent": {
                    "reasoningText": {
                        "text": "Two cities, two calls.",
                        "signature": "EqQBCgIYAhIM1gbcDa9GJwZA",
                    }
                }
            },
            {"reasoningContent": {"redactedContent": sealed}},  # boto3 sends the bytes as base64
            {"toolUse": {"toolUseId": "tooluse_P", "name": "get_weather", "input": {"city": "Paris"}}},
            {"toolUse": {"toolUseId": "tooluse_R", "name": "get_weather", "input": {"city": "Rome"}}},
        ],
    }
    assert [(b["toolResult"]["toolUseId"], b["toolResult"]["status"]) for b in sent_results["content"]] == [
        ("tooluse_P", "success"),
        ("tooluse_R", "error"),
    ]


def test_a_throttling_exception_is_rate_limited_without_a_retry_by_boto3() -> None:
    replies = [bw.error_reply(429, "ThrottlingException", "Too many requests"), bw.stream(bw.cv_text("x"))]

    async def scenario() -> tuple[Exception, int]:
        async with wire.WireServer(replies) as server:
            with pytest.raises(RateLimitedError) as caught:
                await collect(_provider(server.url).complete(ASK))
            return caught.value, len(server.requests)

    error, requests = run(scenario())
    assert "ThrottlingException" in str(error) and requests == 1  # the stage owns retrying


def test_a_service_quota_exceeded_is_rate_limited() -> None:
    error = _fails([bw.error_reply(400, "ServiceQuotaExceededException", "quota")])
    assert isinstance(error, RateLimitedError)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (500, "InternalServerException"),
        (503, "ServiceUnavailableException"),
        (424, "ModelStreamErrorException"),
    ],
)
def test_server_failures_are_transient(status: int, kind: str) -> None:
    error = _fails([bw.error_reply(status, kind, "try again")])
    assert type(error) is TransientModelError and kind in str(error)


def test_a_bare_500_is_transient() -> None:
    assert type(_fails([wire.json_reply(500, {"message": "boom"})])) is TransientModelError


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "ValidationException"), (403, "AccessDeniedException"), (404, "ResourceNotFoundException")],
)
def test_client_errors_are_permanent(status: int, kind: str) -> None:
    error = _fails([bw.error_reply(status, kind, "nope")])
    assert isinstance(error, PermanentModelError) and kind in str(error)


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("throttlingException", RateLimitedError),
        ("modelStreamErrorException", TransientModelError),
        ("internalServerException", TransientModelError),
        ("serviceUnavailableException", TransientModelError),
        ("validationException", PermanentModelError),
    ],
)
def test_an_exception_event_inside_the_stream_is_classified(kind: str, error: type[Exception]) -> None:
    frames = [*bw.cv_text("Sunny")[:2], bw.exception(kind, "mid-stream")]
    caught = _fails([bw.stream(frames)])
    assert type(caught) is error and "mid-stream" in str(caught)


def test_a_stream_dropped_midway_is_incomplete() -> None:
    error = _fails([bw.stream(bw.cv_text("Sunny ", "in ", "Paris."), drop_after=2)])
    assert isinstance(error, IncompleteStreamError) and "broke off" in str(error)


def test_a_stream_that_ends_without_message_stop_is_incomplete() -> None:
    assert isinstance(_fails([bw.stream(bw.cv_text("Sunny")[:-2])]), IncompleteStreamError)


def test_a_stalled_stream_fails_within_the_stall_timeout_and_its_thread_ends() -> None:
    started = time.monotonic()
    error = _fails([bw.stream(bw.cv_text("Sunny"), stall_after=2)], stall_timeout_s=0.3)
    assert isinstance(error, StreamStalledError)
    # Generous for a loaded machine, yet well short of the default stall timeout (180 s)
    # and of the server's stall (an hour).
    assert time.monotonic() - started < 60
    wait_until(lambda: not _stream_threads(), 60, "the stalled stream's thread is still reading")


def test_the_event_loop_runs_while_boto3_blocks() -> None:
    async def scenario() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        async with wire.WireServer([bw.stream(bw.cv_text("Sunny"), stall_after=2)]) as server:
            task = asyncio.create_task(ticker())
            with pytest.raises(StreamStalledError):
                await collect(_provider(server.url, stall_timeout_s=0.5).complete(ASK))
            task.cancel()
            return ticks

    # Half a second of a stream that sends nothing: a loop blocked on the socket would not tick.
    assert run(scenario()) >= 10


def test_closing_the_stream_early_ends_its_thread() -> None:
    async def scenario() -> list[str]:
        async with wire.WireServer([bw.stream(bw.cv_text("Sunny ", "in Paris."), stall_after=3)]) as server:
            stream = _provider(server.url).complete(ASK)
            first = await anext(stream)
            assert first == TextDelta("Sunny ") and _stream_threads()
            await stream.aclose()  # what the stage does to a cancelled completion
            await asyncio.to_thread(
                wait_until, lambda: not _stream_threads(), 60, "the closed stream's thread is still reading"
            )
            return [r.path for r in server.requests]

    assert len(run(scenario())) == 1


def test_cancelling_the_waiting_task_ends_the_stream_and_its_thread() -> None:
    async def scenario() -> bool:
        # Nothing after the first delta: the cancel lands on a wait, not on an arriving event
        # (asyncio.wait_for in Python 3.11 drops a cancel that races with its result).
        async with wire.WireServer([bw.stream(bw.cv_text("Sunny ", "in Paris."), stall_after=2)]) as server:
            seen = asyncio.Event()

            async def consume() -> None:
                async for _ in _provider(server.url).complete(ASK):
                    seen.set()

            task = asyncio.create_task(consume())
            await seen.wait()
            task.cancel()  # the stage giving up on a completion (a stop, a revoked partition)
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.to_thread(wait_until, lambda: not _stream_threads(), 60,
                                    "the cancelled stream's thread is still reading")
            return task.cancelled()

    assert run(scenario())


def test_an_unreachable_endpoint_is_transient() -> None:
    provider = _provider("http://127.0.0.1:9", connect_timeout_s=1)
    with pytest.raises(TransientModelError):
        run(collect(provider.complete(ASK)))


def test_no_credentials_is_permanent(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in bw.CREDENTIALS:
        monkeypatch.delenv(name)

    async def scenario() -> int:
        async with wire.WireServer([bw.stream(bw.cv_text("x"))]) as server:
            with pytest.raises(PermanentModelError, match="credentials"):
                await collect(_provider(server.url).complete(ASK))
            return len(server.requests)

    assert run(scenario()) == 0


def test_a_client_without_a_region_refuses_to_start() -> None:
    with pytest.raises(ConfigError, match="--bedrock-region"):
        bedrock_client(BedrockSettings())


def test_a_request_for_another_model_id_goes_to_that_model() -> None:
    other = request(history(user("hi")), model="bedrock:us.amazon.nova-pro-v1:0", system="")
    _, finished, server = run(_complete([bw.stream(bw.cv_text("ok"))], other))
    assert server.requests[0].path == "/model/us.amazon.nova-pro-v1%3A0/converse-stream"
    assert finished.model == "bedrock:us.amazon.nova-pro-v1:0"
    assert "system" not in server.requests[0].body
