"""Model strings, provider settings (validated, key out of the repr), and routing by request model."""

from __future__ import annotations

import pytest

from tests.processors.providers import wire
from tests.processors.providers.samples import collect, history, request, run, user
from torpor.processors.model import PermanentModelError, ScriptedModel, ScriptedTurn, ScriptRule
from torpor.processors.providers.anthropic_provider import AnthropicProvider
from torpor.processors.providers.openai_compat import OpenAICompatProvider
from torpor.processors.providers.registry import Backend, ModelRef, ModelRouter, parse_model, provider_for
from torpor.processors.providers.settings import EndpointSettings, ProviderSettings
from torpor.schemas.errors import ConfigError
from torpor.schemas.records import TextBlock
from torpor.streams.config import Secret


@pytest.mark.parametrize(
    ("model", "ref"),
    [
        ("openai:gpt-4o-mini", ModelRef(Backend.OPENAI, "gpt-4o-mini")),
        ("openai:Qwen/Qwen2.5-7B-Instruct", ModelRef(Backend.OPENAI, "Qwen/Qwen2.5-7B-Instruct")),
        ("openai:llama3.1:8b", ModelRef(Backend.OPENAI, "llama3.1:8b")),  # Ollama tags keep their colon
        ("anthropic:claude-sonnet-4-5", ModelRef(Backend.ANTHROPIC, "claude-sonnet-4-5")),
        ("scripted", ModelRef(Backend.SCRIPTED, "scripted")),
    ],
)
def test_model_strings_name_the_api_and_the_model(model: str, ref: ModelRef) -> None:
    assert parse_model(model) == ref
    assert str(ref) == model


@pytest.mark.parametrize("model", ["gpt-4o", "bedrock:claude", "openai:", "anthropic", ""])
def test_a_bad_model_string_refuses_to_start(model: str) -> None:
    with pytest.raises(ConfigError):
        parse_model(model)


def test_provider_for_builds_the_named_adapter() -> None:
    settings = ProviderSettings(openai=EndpointSettings(base_url="http://localhost:11434/v1"))
    openai = provider_for("openai:llama3", settings)
    assert isinstance(openai, OpenAICompatProvider) and openai.model == "llama3"
    assert str(openai.client.base_url).startswith("http://localhost:11434/v1")
    assert isinstance(provider_for("anthropic:claude-haiku-4-5", settings), AnthropicProvider)
    assert isinstance(provider_for("scripted", settings), ScriptedModel)


def test_the_key_never_appears_in_a_repr() -> None:
    settings = ProviderSettings(anthropic=EndpointSettings(api_key=Secret("sk-ant-very-secret")))
    assert "very-secret" not in repr(settings)
    assert settings.anthropic.key() == "sk-ant-very-secret"


@pytest.mark.parametrize(
    "bad",
    [
        {"base_url": "localhost:8000"},
        {"base_url": "https://user:pw@example.com/v1"},
        {"stall_timeout_s": 0},
        {"connect_timeout_s": -1},
        {"max_output_tokens": 0},
        {"context_window": 0},
        {"thinking_budget_tokens": 100},
        {"thinking_budget_tokens": 4096, "max_output_tokens": 4096},
    ],
)
def test_invalid_endpoint_settings_refuse_to_start(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        EndpointSettings(**bad)  # type: ignore[arg-type]


def test_the_router_serves_each_request_by_its_own_model() -> None:
    script = [ScriptRule(turns=(ScriptedTurn(chunks=("scripted answer",)),))]

    async def scenario() -> tuple[str, str, list[str]]:
        async with wire.WireServer(
            [wire.Reply(body=wire.openai_sse(wire.oai_text("from the server")))]
        ) as server:
            settings = ProviderSettings(openai=EndpointSettings(base_url=f"{server.url}/v1"))
            router = ModelRouter(settings, default_model="scripted", script=script)
            _, local = await collect(router.complete(request(history(user("hi")))))
            _, remote = await collect(
                router.complete(request(history(user("hi")), model="openai:gpt-4o-mini"))
            )
            names = [m.name for m in router.models()]
            await router.aclose()
            assert local.content == (TextBlock("scripted answer"),)
            return local.model, remote.model, names

    local_model, remote_model, names = run(scenario())
    assert (local_model, remote_model) == ("scripted", f"openai:{wire.OAI_MODEL}")
    assert names == ["scripted", "openai:gpt-4o-mini"]


def test_the_router_fails_a_request_for_an_unknown_model_permanently() -> None:
    router = ModelRouter(ProviderSettings(), default_model="scripted")
    with pytest.raises(PermanentModelError):
        run(collect(router.complete(request(history(user("hi")), model="bedrock:claude"))))


def test_the_router_refuses_a_bad_default_model() -> None:
    with pytest.raises(ConfigError):
        ModelRouter(ProviderSettings(), default_model="gpt-4o")
