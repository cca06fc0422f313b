"""Model strings, provider settings (validated, key out of the repr), and routing by request model."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.processors.providers import bedrock_wire, wire
from tests.processors.providers.samples import collect, history, request, run, user
from torpor.processors.models.provider import PermanentModelError, ScriptedModel, ScriptedTurn, ScriptRule
from torpor.processors.models.providers.anthropic_provider import AnthropicProvider
from torpor.processors.models.providers.bedrock_provider import BedrockProvider
from torpor.processors.models.providers.openai_compat import OpenAICompatProvider
from torpor.processors.models.providers.registry import (
    BEDROCK_EXTRA,
    Backend,
    ModelRef,
    ModelRouter,
    parse_model,
    provider_for,
)
from torpor.processors.models.providers.settings import BedrockSettings, EndpointSettings, ProviderSettings
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
        (  # Bedrock model ids and inference profiles keep their colons
            "bedrock:us.anthropic.claude-sonnet-4-5-20250929-v1:0",
            ModelRef(Backend.BEDROCK, "us.anthropic.claude-sonnet-4-5-20250929-v1:0"),
        ),
        ("scripted", ModelRef(Backend.SCRIPTED, "scripted")),
    ],
)
def test_model_strings_name_the_api_and_the_model(model: str, ref: ModelRef) -> None:
    assert parse_model(model) == ref
    assert str(ref) == model


@pytest.mark.parametrize("model", ["gpt-4o", "vertex:claude", "openai:", "anthropic", "bedrock:", ""])
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


def test_provider_for_builds_bedrock_for_the_configured_region_and_endpoint() -> None:
    settings = ProviderSettings(
        bedrock=BedrockSettings(
            region="eu-west-3", endpoint=EndpointSettings(base_url="http://127.0.0.1:4566")
        )
    )
    bedrock = provider_for("bedrock:amazon.nova-lite-v1:0", settings)
    assert isinstance(bedrock, BedrockProvider) and bedrock.model == "amazon.nova-lite-v1:0"
    assert bedrock.client.meta.region_name == "eu-west-3"
    assert bedrock.client.meta.endpoint_url == "http://127.0.0.1:4566"
    assert [m.name for m in bedrock.models()] == ["bedrock:amazon.nova-lite-v1:0"]


def test_a_bedrock_model_without_a_region_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--bedrock-region"):
        provider_for("bedrock:amazon.nova-lite-v1:0", ProviderSettings())
    with pytest.raises(ConfigError, match="--bedrock-region"):
        ModelRouter(ProviderSettings(), default_model="bedrock:amazon.nova-lite-v1:0")
    router = ModelRouter(ProviderSettings(), default_model="scripted")
    with pytest.raises(PermanentModelError, match="--bedrock-region"):
        run(collect(router.complete(request(history(user("hi")), model="bedrock:amazon.nova-lite-v1:0"))))


# A fresh interpreter in which boto3 cannot be imported: every other backend still runs.
_WITHOUT_BOTO3 = textwrap.dedent(
    """
    import asyncio, sys
    sys.modules["boto3"] = None  # what `import boto3` meets when the extra is not installed
    from torpor.processors.models.provider import PermanentModelError, ScriptedTurn, ScriptRule
    from torpor.processors.models.providers.registry import ModelRouter, provider_for
    from torpor.processors.models.providers.settings import BedrockSettings, ProviderSettings
    from torpor.schemas.errors import ConfigError
    from tests.processors.providers.samples import collect, history, request, user

    settings = ProviderSettings(bedrock=BedrockSettings(region="us-east-1"))
    script = [ScriptRule(turns=(ScriptedTurn(chunks=("fine",)),))]
    router = ModelRouter(settings, default_model="scripted", script=script)
    _, done = asyncio.run(collect(router.complete(request(history(user("hi"))))))
    print("scripted:", done.content[0].text)
    print("openai:", type(provider_for("openai:gpt-4o-mini", settings)).__name__)
    try:
        asyncio.run(collect(router.complete(request(history(user("hi")), model="bedrock:m"))))
    except PermanentModelError as exc:
        print("request:", exc)
    try:
        ModelRouter(settings, default_model="bedrock:m")
    except ConfigError as exc:
        print("start:", exc)
    print("boto3 imported:", any(name.startswith("botocore") for name in sys.modules))
    """
)


def _python(script: str) -> str:
    """What `script` prints, run by this Python in a process of its own (a fresh `sys.modules`)."""
    ran = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def test_without_boto3_every_other_backend_runs_and_bedrock_says_what_to_install() -> None:
    stdout = _python(_WITHOUT_BOTO3)
    lines = dict(line.split(": ", 1) for line in stdout.splitlines())
    assert (lines["scripted"], lines["openai"]) == ("fine", "OpenAICompatProvider")
    assert BEDROCK_EXTRA in lines["request"] and BEDROCK_EXTRA in lines["start"]
    assert lines["boto3 imported"] == "False"


_SDKS_ON_DEMAND = textwrap.dedent(
    """
    import asyncio, sys
    import torpor.cli.processor, torpor.cli.processor_run, torpor.cli.local, torpor.cli.connector
    import torpor.inspector.app
    from torpor.processors.models.providers.registry import ModelRouter, parse_model
    from torpor.processors.models.providers.settings import ProviderSettings
    from tests.processors.providers.samples import collect, history, request, user

    def imported():
        return sorted(name for name in ("openai", "anthropic") if name in sys.modules)

    router = ModelRouter(ProviderSettings(), "scripted")
    asyncio.run(collect(router.complete(request(history(user("hi"))))))
    print("after scripted:", imported())
    print("openai serves:", type(router.provider(parse_model("openai:m"))).__name__)
    print("after openai:", imported())
    print("anthropic serves:", type(router.provider(parse_model("anthropic:m"))).__name__)
    print("after anthropic:", imported())
    """
)


_DEFAULT_AT_START = textwrap.dedent(
    """
    import sys
    from torpor.processors.models.providers.registry import ModelRouter
    from torpor.processors.models.providers.settings import ProviderSettings

    ModelRouter(ProviderSettings(), "anthropic:m")
    print(sorted(name for name in ("openai", "anthropic") if name in sys.modules))
    """
)


def test_a_router_imports_its_default_models_sdk_when_it_is_made() -> None:
    # Not in the first completion, where the import (1.5 s for anthropic) holds up the stage's loop.
    stdout = _python(_DEFAULT_AT_START)
    assert stdout.strip() == "['anthropic']"


def test_a_process_imports_an_api_sdk_only_when_a_model_of_that_api_is_served() -> None:
    # Why it matters: the two SDKs are about 100 MiB of every processor's resident memory.
    stdout = _python(_SDKS_ON_DEMAND)
    lines = dict(line.split(": ", 1) for line in stdout.splitlines())
    assert lines["after scripted"] == "[]"
    assert (lines["openai serves"], lines["after openai"]) == ("OpenAICompatProvider", "['openai']")
    assert lines["anthropic serves"] == "AnthropicProvider"
    assert lines["after anthropic"] == "['anthropic', 'openai']"


def test_bedrock_settings_name_a_region_and_take_no_key() -> None:
    with pytest.raises(ConfigError):
        BedrockSettings(region="us east 1")
    with pytest.raises(ConfigError):
        BedrockSettings(region="us-east-1", endpoint=EndpointSettings(api_key=Secret("AKIA-no")))
    with pytest.raises(ConfigError):
        BedrockSettings(endpoint=EndpointSettings(base_url="bedrock.local"))
    assert BedrockSettings(region="us-gov-west-1").region == "us-gov-west-1"


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


def test_the_router_serves_bedrock_with_one_client_for_every_model_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bedrock_wire.client_environment(monkeypatch)
    bw = bedrock_wire

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        replies = [bw.stream(bw.cv_text("one")), bw.stream(bw.cv_text("two"))]
        async with wire.WireServer(replies) as server:
            endpoint = EndpointSettings(base_url=server.url)
            settings = ProviderSettings(bedrock=BedrockSettings(region=bw.REGION, endpoint=endpoint))
            router = ModelRouter(settings, default_model="bedrock:amazon.nova-lite-v1:0")
            client = router.provider(parse_model("bedrock:x"))
            _, first = await collect(router.complete(request(history(user("hi")))))
            _, second = await collect(
                router.complete(request(history(user("hi")), model="bedrock:other-model"))
            )
            again = router.provider(parse_model("bedrock:y"))
            assert isinstance(client, BedrockProvider) and isinstance(again, BedrockProvider)
            assert client.client is again.client
            names = [m.name for m in router.models()]
            await router.aclose()
            return [first.model, second.model], [r.path for r in server.requests], names

    models, paths, names = run(scenario())
    assert models == ["bedrock:amazon.nova-lite-v1:0", "bedrock:other-model"]
    assert paths == ["/model/amazon.nova-lite-v1%3A0/converse-stream", "/model/other-model/converse-stream"]
    assert names == ["bedrock:amazon.nova-lite-v1:0", "bedrock:other-model"]


def test_the_router_fails_a_request_for_an_unknown_model_permanently() -> None:
    router = ModelRouter(ProviderSettings(), default_model="scripted")
    with pytest.raises(PermanentModelError):
        run(collect(router.complete(request(history(user("hi")), model="vertex:claude"))))


def test_the_router_refuses_a_bad_default_model() -> None:
    with pytest.raises(ConfigError):
        ModelRouter(ProviderSettings(), default_model="gpt-4o")


def test_the_router_serves_again_after_closing_its_clients() -> None:
    # The router keeps each model string's provider built; closing the clients must drop
    # them too, or the next request would go out on a closed connection pool.
    async def scenario() -> tuple[str, str, int]:
        replies = [wire.Reply(body=wire.openai_sse(wire.oai_text(t))) for t in ("first", "second")]
        async with wire.WireServer(replies) as server:
            settings = ProviderSettings(openai=EndpointSettings(base_url=f"{server.url}/v1"))
            router = ModelRouter(settings, default_model="openai:gpt-4o-mini")
            _, first = await collect(router.complete(request(history(user("hi")))))
            await router.aclose()
            _, second = await collect(router.complete(request(history(user("hi")))))
            await router.aclose()
            assert isinstance(first.content[0], TextBlock) and isinstance(second.content[0], TextBlock)
            return first.content[0].text, second.content[0].text, len(server.requests)

    assert run(scenario()) == ("first", "second", 2)
