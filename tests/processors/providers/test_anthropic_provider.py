"""`AnthropicProvider` through the real `anthropic` client against a local Messages API server."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.processors.providers import wire
from tests.processors.providers.samples import WEATHER, collect, history, request, result, run, user
from torpor.processors.models.provider import (
    CompletionRequest,
    Finished,
    PermanentModelError,
    TransientModelError,
)
from torpor.processors.models.providers.anthropic_provider import AnthropicProvider, anthropic_client
from torpor.processors.models.providers.errors import (
    IncompleteStreamError,
    RateLimitedError,
    StreamStalledError,
)
from torpor.processors.models.providers.settings import EndpointSettings
from torpor.schemas.records import AssistantEntry, TextBlock, ThinkingBlock, ToolCall, Usage
from torpor.streams.config import Secret

ASK = request(history(user("Weather in Paris?")), model="anthropic:claude-sonnet-4-5", tools=(WEATHER,))


async def _complete(
    replies: list[wire.Reply], req: CompletionRequest = ASK, **settings: Any
) -> tuple[list[str], Finished, wire.WireServer]:
    async with wire.WireServer(replies) as server:
        endpoint = EndpointSettings(base_url=server.url, api_key=Secret("sk-ant-test"), **settings)
        provider = AnthropicProvider(anthropic_client(endpoint), "claude-sonnet-4-5", endpoint)
        deltas, finished = await collect(provider.complete(req))
        return deltas, finished, server


def _fails(replies: list[wire.Reply], **settings: Any) -> Exception:
    with pytest.raises(Exception) as caught:
        run(_complete(replies, **settings))
    return caught.value


def _sse(events: list[wire.JSON], **reply: int) -> wire.Reply:
    return wire.Reply(body=wire.anthropic_sse(events), **reply)  # type: ignore[arg-type]


def test_a_text_stream_yields_deltas_then_the_turn_with_usage() -> None:
    deltas, finished, server = run(_complete([_sse(wire.ant_text("Sunny ", "in Paris."))]))
    assert deltas == ["Sunny ", "in Paris."]
    assert finished == Finished(
        (TextBlock("Sunny in Paris."),), (), Usage(25, 15, 40), f"anthropic:{wire.ANT_MODEL}"
    )
    (sent,) = server.requests
    assert (sent.method, sent.path, sent.headers["authorization"]) == (
        "POST",
        "/v1/messages",
        "Bearer sk-ant-test",
    )
    assert "anthropic-version" in sent.headers
    body = sent.body
    assert (body["model"], body["stream"], body["system"], body["max_tokens"]) == (
        "claude-sonnet-4-5",
        True,
        "Be brief.",
        8192,
    )
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}]
    assert body["tools"][0]["name"] == "get_weather" and "thinking" not in body


def _thinking_then_two_calls() -> list[wire.JSON]:
    return [
        wire.ant_start(),
        wire.ant_block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        wire.ant_delta(0, {"type": "thinking_delta", "thinking": "Two cities, two calls."}),
        wire.ant_delta(0, {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA"}),
        wire.ant_block_stop(0),
        wire.ant_block_start(1, {"type": "tool_use", "id": "toolu_P", "name": "get_weather", "input": {}}),
        wire.ant_delta(1, {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}),
        wire.ant_block_stop(1),
        wire.ant_block_start(2, {"type": "tool_use", "id": "toolu_R", "name": "get_weather", "input": {}}),
        wire.ant_delta(2, {"type": "input_json_delta", "partial_json": ""}),
        wire.ant_delta(2, {"type": "input_json_delta", "partial_json": '{"city": "Rome"}'}),
        wire.ant_block_stop(2),
        *wire.ant_end("tool_use", 60),
    ]


def test_thinking_with_its_signature_and_parallel_tool_use_round_trip() -> None:
    deltas, finished, server = run(_complete([_sse(_thinking_then_two_calls())], thinking_budget_tokens=2048))
    assert deltas == []  # thinking is not live output
    assert finished.content == (ThinkingBlock("Two cities, two calls.", "EqQBCgIYAhIM1gbcDa9GJwZA"),)
    assert finished.tool_calls == (
        ToolCall("toolu_P", "get_weather", '{"city": "Paris"}'),
        ToolCall("toolu_R", "get_weather", '{"city": "Rome"}'),
    )
    assert server.requests[0].body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    # Committed, answered, and sent back: the signed thinking first, the calls, one result message.
    turn = AssistantEntry(finished.content, finished.tool_calls, finished.model, finished.usage)
    follow_up = request(
        history(
            user("Weather in Paris?"),
            turn,
            result("toolu_P", "sun"),
            result("toolu_R", "no such city", ok=False),
        ),
        model="anthropic:claude-sonnet-4-5",
    )
    _, _, server = run(_complete([_sse(wire.ant_text("ok"))], follow_up, thinking_budget_tokens=2048))
    _, sent_turn, sent_results = server.requests[0].body["messages"]
    assert sent_turn == {
        "role": "assistant",
        "content": [
            {
                "type": "thinking",
                "thinking": "Two cities, two calls.",
                "signature": "EqQBCgIYAhIM1gbcDa9GJwZA",
            },
            {"type": "tool_use", "id": "toolu_P", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_R", "name": "get_weather", "input": {"city": "Rome"}},
        ],
    }
    assert [(b["tool_use_id"], b["is_error"]) for b in sent_results["content"]] == [
        ("toolu_P", False),
        ("toolu_R", True),
    ]


def test_a_429_is_rate_limited_with_the_retry_after_hint() -> None:
    error = _fails(
        [wire.json_reply(429, wire.ant_error("rate_limit_error", "slow down"), {"retry-after": "3"})]
    )
    assert isinstance(error, RateLimitedError) and error.retry_after_s == 3.0


def test_a_529_overloaded_is_rate_limited() -> None:
    error = _fails([wire.json_reply(529, wire.ant_error("overloaded_error", "Overloaded"))])
    assert isinstance(error, RateLimitedError) and error.retry_after_s is None


def test_a_500_is_transient() -> None:
    error = _fails([wire.json_reply(500, wire.ant_error("api_error", "Internal server error"))])
    assert type(error) is TransientModelError


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (404, "not_found_error")],
)
def test_client_errors_are_permanent(status: int, kind: str) -> None:
    error = _fails([wire.json_reply(status, wire.ant_error(kind, "nope"))])
    assert isinstance(error, PermanentModelError) and kind in str(error)


def test_an_overloaded_error_event_inside_the_stream_is_rate_limited() -> None:
    events = [*wire.ant_text("Sunny")[:4], wire.ant_error("overloaded_error", "Overloaded")]
    assert isinstance(_fails([_sse(events)]), RateLimitedError)


def test_a_stream_dropped_midway_is_incomplete() -> None:
    error = _fails([_sse(wire.ant_text("Sunny ", "in ", "Paris."), drop_after=4)])
    assert isinstance(error, IncompleteStreamError) and "broke off" in str(error)


def test_a_stream_that_ends_without_message_stop_is_incomplete() -> None:
    assert isinstance(_fails([_sse(wire.ant_text("Sunny")[:-1])]), IncompleteStreamError)


def test_a_stalled_stream_fails_within_the_stall_timeout() -> None:
    started = time.monotonic()
    error = _fails([_sse(wire.ant_text("Sunny"), stall_after=3)], stall_timeout_s=0.3)
    assert isinstance(error, StreamStalledError)
    # Generous for a loaded machine, yet well short of the default stall timeout (180 s)
    # and of the server's stall (an hour).
    assert time.monotonic() - started < 60


def test_an_unreachable_server_is_transient() -> None:
    endpoint = EndpointSettings(base_url="http://127.0.0.1:9", connect_timeout_s=1)
    provider = AnthropicProvider(anthropic_client(endpoint), "claude-sonnet-4-5", endpoint)
    with pytest.raises(TransientModelError):
        run(collect(provider.complete(ASK)))


def test_without_a_key_the_environment_is_not_consulted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-the-environment")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")

    async def scenario() -> wire.Recorded:
        async with wire.WireServer([_sse(wire.ant_text("ok"))]) as server:
            endpoint = EndpointSettings(base_url=server.url)
            provider = AnthropicProvider(anthropic_client(endpoint), "claude-haiku-4-5", endpoint)
            await collect(provider.complete(request(history(user("hi")), system="")))
            return server.requests[0]

    sent = run(scenario())
    assert sent.headers["authorization"] == "Bearer no-key"  # how this client version sends a key
    assert sent.body["model"] == "claude-haiku-4-5" and "system" not in sent.body and "tools" not in sent.body
