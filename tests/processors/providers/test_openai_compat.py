"""`OpenAICompatProvider` through the real `openai` client against a local chat completions server."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.processors.providers import wire
from tests.processors.providers.samples import (
    WEATHER,
    collect,
    history,
    request,
    result,
    run,
    user,
)
from torpor.processors.models.provider import (
    CompletionRequest,
    Finished,
    PermanentModelError,
    TransientModelError,
)
from torpor.processors.models.providers.errors import (
    IncompleteStreamError,
    RateLimitedError,
    StreamStalledError,
)
from torpor.processors.models.providers.openai_compat import OpenAICompatProvider, openai_client
from torpor.processors.models.providers.settings import EndpointSettings
from torpor.schemas.records import AssistantEntry, TextBlock, ToolCall, Usage
from torpor.streams.config import Secret

ASK = request(history(user("Weather in Paris and Rome?")), model="openai:gpt-4o-mini", tools=(WEATHER,))


async def _complete(
    replies: list[wire.Reply], req: CompletionRequest = ASK, **settings: Any
) -> tuple[list[str], Finished, wire.WireServer]:
    async with wire.WireServer(replies) as server:
        endpoint = EndpointSettings(base_url=f"{server.url}/v1", api_key=Secret("sk-test"), **settings)
        provider = OpenAICompatProvider(openai_client(endpoint), "gpt-4o-mini", endpoint)
        deltas, finished = await collect(provider.complete(req))
        return deltas, finished, server


def _fails(replies: list[wire.Reply], **settings: Any) -> Exception:
    with pytest.raises(Exception) as caught:
        run(_complete(replies, **settings))
    return caught.value


def test_a_text_stream_yields_deltas_then_the_turn_with_usage() -> None:
    deltas, finished, server = run(
        _complete([wire.Reply(body=wire.openai_sse(wire.oai_text("Sunny ", "in Paris.")))])
    )
    assert deltas == ["Sunny ", "in Paris."]
    assert finished == Finished(
        (TextBlock("Sunny in Paris."),), (), Usage(11, 7, 18), f"openai:{wire.OAI_MODEL}"
    )
    (sent,) = server.requests
    assert (sent.method, sent.path, sent.headers["authorization"]) == (
        "POST",
        "/v1/chat/completions",
        "Bearer sk-test",
    )
    assert sent.body["model"] == "gpt-4o-mini" and sent.body["stream"] is True
    assert sent.body["stream_options"] == {"include_usage": True}
    assert sent.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
    ]
    assert sent.body["tools"][0]["function"]["name"] == "get_weather"


def _parallel_calls() -> list[wire.JSON]:
    def call(index: int, call_id: str) -> wire.JSON:
        return {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }

    def args(index: int, text: str) -> wire.JSON:
        return {"index": index, "function": {"arguments": text}}

    return [
        wire.oai_chunk({"role": "assistant", "content": None, "tool_calls": [call(0, "call_P")]}),
        wire.oai_chunk({"tool_calls": [args(0, '{"city":')]}),
        wire.oai_chunk({"tool_calls": [args(0, '"Paris"}')]}),
        wire.oai_chunk({"tool_calls": [call(1, "call_R")]}),
        wire.oai_chunk({"tool_calls": [args(1, '{"city":"Rome"}')]}),
        wire.oai_chunk({}, "tool_calls"),
        wire.oai_usage(40, 30),
    ]


def test_parallel_tool_calls_arrive_whole_and_go_back_in_the_next_request() -> None:
    deltas, finished, _ = run(_complete([wire.Reply(body=wire.openai_sse(_parallel_calls()))]))
    assert deltas == []
    assert finished.tool_calls == (
        ToolCall("call_P", "get_weather", '{"city":"Paris"}'),
        ToolCall("call_R", "get_weather", '{"city":"Rome"}'),
    )
    # The turn as the fold commits it, answered, then sent back: the same ids and arguments.
    turn = AssistantEntry(finished.content, finished.tool_calls, finished.model, finished.usage)
    follow_up = request(
        history(user("Weather in Paris and Rome?"), turn, result("call_P", "sun"), result("call_R", "rain")),
        model="openai:gpt-4o-mini",
    )
    _, _, server = run(_complete([wire.Reply(body=wire.openai_sse(wire.oai_text("ok")))], follow_up))
    messages = server.requests[0].body["messages"]
    assert messages[2]["tool_calls"] == [
        {
            "id": "call_P",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        },
        {
            "id": "call_R",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
        },
    ]
    assert [(m["role"], m.get("tool_call_id")) for m in messages[3:]] == [
        ("tool", "call_P"),
        ("tool", "call_R"),
    ]


def test_a_429_is_rate_limited_with_the_retry_after_hint() -> None:
    error = _fails(
        [
            wire.json_reply(
                429,
                wire.oai_error("Rate limit reached", "requests", "rate_limit_exceeded"),
                {"retry-after": "7"},
            )
        ]
    )
    assert isinstance(error, RateLimitedError) and error.retry_after_s == 7.0


def test_a_500_is_transient() -> None:
    error = _fails([wire.json_reply(500, wire.oai_error("The server had an error", "server_error"))])
    assert isinstance(error, TransientModelError) and not isinstance(error, RateLimitedError)


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "invalid_request_error"), (404, "invalid_request_error")],
)
def test_client_errors_are_permanent(status: int, kind: str) -> None:
    error = _fails([wire.json_reply(status, wire.oai_error("nope", kind))])
    assert isinstance(error, PermanentModelError) and f"({status})" in str(error)


def test_a_stream_dropped_midway_is_transient() -> None:
    body = wire.openai_sse(wire.oai_text("Sunny ", "in ", "Paris."))
    error = _fails([wire.Reply(body=body, drop_after=2)])
    assert isinstance(error, IncompleteStreamError) and "broke off" in str(error)


def test_a_stream_that_ends_without_a_finish_reason_is_incomplete() -> None:
    body = wire.openai_sse([wire.oai_chunk({"content": "Sunny"})], done=False)
    assert isinstance(_fails([wire.Reply(body=body)]), IncompleteStreamError)


def test_a_stalled_stream_fails_within_the_stall_timeout() -> None:
    started = time.monotonic()
    error = _fails(
        [wire.Reply(body=wire.openai_sse(wire.oai_text("Sunny")), stall_after=2)], stall_timeout_s=0.3
    )
    assert isinstance(error, StreamStalledError)
    # Generous for a loaded machine, yet well short of the default stall timeout (180 s)
    # and of the server's stall (an hour).
    assert time.monotonic() - started < 60


def test_an_error_event_inside_the_stream_is_transient() -> None:
    body = wire.openai_sse([wire.oai_chunk({"content": "Sun"}), wire.oai_error("overloaded", "server_error")])
    assert type(_fails([wire.Reply(body=body)])) is TransientModelError


def test_an_unreachable_server_is_transient() -> None:
    endpoint = EndpointSettings(base_url="http://127.0.0.1:9/v1", connect_timeout_s=1)
    provider = OpenAICompatProvider(openai_client(endpoint), "m", endpoint)
    with pytest.raises(TransientModelError):
        run(collect(provider.complete(ASK)))


def test_without_a_key_the_environment_is_not_consulted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")

    async def scenario() -> wire.Recorded:
        async with wire.WireServer([wire.Reply(body=wire.openai_sse(wire.oai_text("ok")))]) as server:
            endpoint = EndpointSettings(base_url=f"{server.url}/v1")
            provider = OpenAICompatProvider(openai_client(endpoint), "llama3", endpoint)
            await collect(provider.complete(request(history(user("hi")))))
            return server.requests[0]

    sent = run(scenario())
    assert sent.headers["authorization"] == "Bearer no-key"
    assert sent.body["model"] == "llama3"  # an unprefixed request model: the provider's own
    assert "tools" not in sent.body


def test_max_output_tokens_is_sent_when_set() -> None:
    _, _, server = run(
        _complete([wire.Reply(body=wire.openai_sse(wire.oai_text("ok")))], max_output_tokens=256)
    )
    assert server.requests[0].body["max_completion_tokens"] == 256
    assert json.dumps(server.requests[0].body).count("max_tokens") == 0


def test_whole_calls_without_an_index_each_get_their_own_call() -> None:
    # Some compatible servers (older Ollama) send each call whole, with no `index`.
    whole = [
        {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "X"}'},
        }
        for n in (1, 2)
    ]
    chunks = [wire.oai_chunk({"role": "assistant", "tool_calls": whole}), wire.oai_chunk({}, "tool_calls")]
    _, finished, _ = run(_complete([wire.Reply(body=wire.openai_sse(chunks))]))
    assert [(c.call_id, c.arguments) for c in finished.tool_calls] == [
        ("call_1", '{"city": "X"}'),
        ("call_2", '{"city": "X"}'),
    ]
