"""The `ModelProvider` contract, run against every implementation: scripted, OpenAI, Anthropic, Bedrock.

Each scenario (a text turn, a turn of parallel tool calls, a transient failure, a
permanent one) is served by the scripted model from its script and by the three adapters
from a local server speaking their wire format; all must answer alike.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import pytest

from tests.processors.providers import bedrock_wire, wire
from tests.processors.providers.samples import WEATHER, collect, history, request, run, user
from torpor.processors.models.provider import (
    ModelProvider,
    PermanentModelError,
    ScriptedCall,
    ScriptedModel,
    ScriptedTurn,
    ScriptRule,
    TransientModelError,
)
from torpor.processors.models.providers.anthropic_provider import AnthropicProvider, anthropic_client
from torpor.processors.models.providers.bedrock_provider import BedrockProvider, bedrock_client
from torpor.processors.models.providers.openai_compat import OpenAICompatProvider, openai_client
from torpor.processors.models.providers.settings import BedrockSettings, EndpointSettings
from torpor.schemas.records import TextBlock

CITY: Final = '{"city": "Paris"}'


def _scripted_turn(scenario: str) -> ScriptedTurn:
    return {
        "text": ScriptedTurn(chunks=("Sunny ", "in Paris.")),
        "tools": ScriptedTurn(
            tool_calls=(ScriptedCall("get_weather", CITY), ScriptedCall("get_weather", CITY))
        ),
        "transient": ScriptedTurn(transient_failures=1),
        "permanent": ScriptedTurn(permanent_failure=True),
    }[scenario]


def _openai_reply(scenario: str) -> wire.Reply:
    def call(index: int) -> wire.JSON:
        fn = {"name": "get_weather", "arguments": CITY}
        return {"index": index, "id": f"call_{index}", "type": "function", "function": fn}

    tools = [wire.oai_chunk({"tool_calls": [call(0)]}), wire.oai_chunk({"tool_calls": [call(1)]})]
    return {
        "text": wire.Reply(body=wire.openai_sse(wire.oai_text("Sunny ", "in Paris."))),
        "tools": wire.Reply(
            body=wire.openai_sse([*tools, wire.oai_chunk({}, "tool_calls"), wire.oai_usage(9, 9)])
        ),
        "transient": wire.json_reply(503, wire.oai_error("overloaded", "server_error")),
        "permanent": wire.json_reply(400, wire.oai_error("bad", "invalid_request_error")),
    }[scenario]


def _anthropic_reply(scenario: str) -> wire.Reply:
    def use(index: int) -> list[wire.JSON]:
        return [
            wire.ant_block_start(
                index, {"type": "tool_use", "id": f"toolu_{index}", "name": "get_weather", "input": {}}
            ),
            wire.ant_delta(index, {"type": "input_json_delta", "partial_json": CITY}),
            wire.ant_block_stop(index),
        ]

    return {
        "text": wire.Reply(body=wire.anthropic_sse(wire.ant_text("Sunny ", "in Paris."))),
        "tools": wire.Reply(
            body=wire.anthropic_sse([wire.ant_start(), *use(0), *use(1), *wire.ant_end("tool_use", 9)])
        ),
        "transient": wire.json_reply(500, wire.ant_error("api_error", "oops")),
        "permanent": wire.json_reply(400, wire.ant_error("invalid_request_error", "bad")),
    }[scenario]


def _bedrock_reply(scenario: str) -> wire.Reply:
    bw = bedrock_wire
    return {
        "text": bw.stream(bw.cv_text("Sunny ", "in Paris.")),
        "tools": bw.stream(
            [
                bw.cv_start(),
                *bw.cv_tool(0, "tooluse_0", CITY),
                *bw.cv_tool(1, "tooluse_1", CITY),
                *bw.cv_end("tool_use"),
            ]
        ),
        "transient": bw.error_reply(503, "ServiceUnavailableException", "overloaded"),
        "permanent": bw.error_reply(400, "ValidationException", "bad"),
    }[scenario]


@pytest.fixture(autouse=True)
def _aws(monkeypatch: pytest.MonkeyPatch) -> None:
    bedrock_wire.client_environment(monkeypatch)  # dummy credentials; the others ignore them


@asynccontextmanager
async def scripted(scenario: str) -> AsyncIterator[ModelProvider]:
    yield ScriptedModel([ScriptRule(turns=(_scripted_turn(scenario),))])


@asynccontextmanager
async def openai(scenario: str) -> AsyncIterator[ModelProvider]:
    async with wire.WireServer([_openai_reply(scenario)]) as server:
        settings = EndpointSettings(base_url=f"{server.url}/v1")
        yield OpenAICompatProvider(openai_client(settings), "gpt-4o-mini", settings)


@asynccontextmanager
async def anthropic(scenario: str) -> AsyncIterator[ModelProvider]:
    async with wire.WireServer([_anthropic_reply(scenario)]) as server:
        settings = EndpointSettings(base_url=server.url)
        yield AnthropicProvider(anthropic_client(settings), "claude-sonnet-4-5", settings)


@asynccontextmanager
async def bedrock(scenario: str) -> AsyncIterator[ModelProvider]:
    async with wire.WireServer([_bedrock_reply(scenario)]) as server:
        settings = BedrockSettings(region=bedrock_wire.REGION, endpoint=EndpointSettings(base_url=server.url))
        yield BedrockProvider(bedrock_client(settings), bedrock_wire.MODEL, settings)


PROVIDERS: Final = {"scripted": scripted, "openai": openai, "anthropic": anthropic, "bedrock": bedrock}
ASK: Final = request(history(user("Weather in Paris, twice?")), tools=(WEATHER,))


@pytest.mark.parametrize("name", PROVIDERS)
def test_a_text_turn_streams_deltas_then_one_finished_with_their_text(name: str) -> None:
    async def scenario() -> None:
        async with PROVIDERS[name]("text") as provider:
            deltas, finished = await collect(provider.complete(ASK))
        assert "".join(deltas) == "Sunny in Paris."
        assert finished.content == (TextBlock("Sunny in Paris."),) and finished.tool_calls == ()
        assert finished.usage.total_tokens >= 0 and finished.model

    run(scenario())


@pytest.mark.parametrize("name", PROVIDERS)
def test_parallel_tool_calls_come_whole_with_distinct_ids(name: str) -> None:
    async def scenario() -> None:
        async with PROVIDERS[name]("tools") as provider:
            deltas, finished = await collect(provider.complete(ASK))
        assert deltas == []
        assert [(c.name, json.loads(c.arguments)) for c in finished.tool_calls] == [
            ("get_weather", {"city": "Paris"})
        ] * 2
        assert len({c.call_id for c in finished.tool_calls}) == 2

    run(scenario())


@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize(
    ("case", "error"), [("transient", TransientModelError), ("permanent", PermanentModelError)]
)
def test_failures_are_classified_for_the_stage(name: str, case: str, error: type[Exception]) -> None:
    async def scenario() -> None:
        async with PROVIDERS[name](case) as provider:
            with pytest.raises(error):
                await collect(provider.complete(ASK))

    run(scenario())
