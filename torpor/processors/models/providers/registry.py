"""Choosing a provider by a model string, and routing each request to the right one.

A model string names the API and the model: `openai:gpt-4o-mini` (any OpenAI-compatible
server: the `openai` endpoint's base URL decides which), `anthropic:claude-sonnet-4-5`,
`bedrock:<model id or inference profile>` (Amazon Bedrock's Converse API), or
`scripted` (the deterministic `ScriptedModel`, for tests and local runs).
`parse_model` splits and checks one; a wrong one is a `ConfigError` at startup, not a
failed completion later.

`provider_for(model, settings, script)` builds the provider for one model string.
`ModelRouter` is the `ModelProvider` the model stage gets: it routes every request by
its own `request.model` (a thread may be switched to another model with `set_model`),
building each API's client once, on first use, and `aclose()` closes them.
Settings come in as `ProviderSettings`; nothing here reads the environment.

Each API's adapter and SDK is imported only when a model of that API is first served
(`openai_adapter`, `anthropic_adapter`, `bedrock_adapter`), or when a `ModelRouter` whose
default model is of that API is made (at start, not in the first completion). Why:
importing the `anthropic` and `openai` SDKs costs about 100 MiB of resident memory and
4,600 modules, in every processor and CLI process, whether or not a thread ever names
that API. Bedrock is also an optional extra (`pip install 'torpor[bedrock]'`, which
brings boto3): a processor without boto3 runs every other backend, and a `bedrock:` model
without it is a `ConfigError` (a failed completion, for a thread's own model) that says
what to install.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Final

from torpor.processors.models.provider import (
    CompletionRequest,
    ModelInfo,
    ModelOutput,
    ModelProvider,
    PermanentModelError,
    ScriptedModel,
    ScriptRule,
)
from torpor.processors.models.providers.settings import BedrockSettings, EndpointSettings, ProviderSettings
from torpor.schemas.errors import ConfigError

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic
    from mypy_boto3_bedrock_runtime import BedrockRuntimeClient
    from openai import AsyncOpenAI

    from torpor.processors.models.providers.anthropic_provider import AnthropicProvider
    from torpor.processors.models.providers.bedrock_provider import BedrockProvider
    from torpor.processors.models.providers.openai_compat import OpenAICompatProvider

BEDROCK_EXTRA: Final = "pip install 'torpor[bedrock]'"


class Backend(StrEnum):
    """The APIs Torpor speaks, spelled as in model strings."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    BEDROCK = "bedrock"
    SCRIPTED = "scripted"


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A parsed model string: the API and the API's own name for the model."""

    backend: Backend
    name: str

    def __str__(self) -> str:
        return self.backend.value if self.backend is Backend.SCRIPTED else f"{self.backend}:{self.name}"


def parse_model(model: str) -> ModelRef:
    """`<backend>:<name>`, or `scripted`. Raises `ConfigError` saying what is accepted."""
    head, sep, name = model.strip().partition(":")
    try:
        backend = Backend(head)
    except ValueError:
        raise ConfigError(
            f"model {model!r}: unknown provider {head!r}; write openai:<model> (any OpenAI-compatible "
            "server), anthropic:<model>, bedrock:<model id> or scripted"
        ) from None
    if backend is Backend.SCRIPTED:
        return ModelRef(backend, name or "scripted")
    if not sep or not name:
        raise ConfigError(f"model {model!r}: name the model after the provider, e.g. {head}:<model>")
    return ModelRef(backend, name)


def openai_adapter() -> tuple[type[OpenAICompatProvider], Callable[[EndpointSettings], AsyncOpenAI]]:
    """The OpenAI-compatible provider class and client factory, imported now (module docstring)."""
    from torpor.processors.models.providers.openai_compat import OpenAICompatProvider, openai_client

    return OpenAICompatProvider, openai_client


def anthropic_adapter() -> tuple[type[AnthropicProvider], Callable[[EndpointSettings], AsyncAnthropic]]:
    """The Anthropic provider class and client factory, imported now (module docstring)."""
    from torpor.processors.models.providers.anthropic_provider import AnthropicProvider, anthropic_client

    return AnthropicProvider, anthropic_client


def bedrock_adapter() -> tuple[type[BedrockProvider], Callable[[BedrockSettings], BedrockRuntimeClient]]:
    """The Bedrock provider class and client factory, imported now.

    Raises `ConfigError` if boto3 is not installed.
    """
    try:
        from torpor.processors.models.providers.bedrock_provider import BedrockProvider, bedrock_client
    except ImportError as exc:
        raise ConfigError(
            f"a bedrock: model needs boto3, which is not installed ({exc.name} is missing): {BEDROCK_EXTRA}"
        ) from exc
    return BedrockProvider, bedrock_client


def provider_for(model: str, settings: ProviderSettings, script: Sequence[ScriptRule] = ()) -> ModelProvider:
    """A provider serving `model`, with its own client. Raises `ConfigError` for a bad string."""
    ref = parse_model(model)
    match ref.backend:
        case Backend.OPENAI:
            openai, openai_client = openai_adapter()
            return openai(openai_client(settings.openai), ref.name, settings.openai)
        case Backend.ANTHROPIC:
            anthropic, anthropic_client = anthropic_adapter()
            return anthropic(anthropic_client(settings.anthropic), ref.name, settings.anthropic)
        case Backend.BEDROCK:
            provider, client = bedrock_adapter()
            return provider(client(settings.bedrock), ref.name, settings.bedrock)
        case Backend.SCRIPTED:
            return ScriptedModel(script)


PROVIDERS_KEPT: Final = 256
"""Model strings whose provider the router keeps built (a thread's model is its own choice,
so the strings seen are bounded only by this; past it, the kept ones are built again)."""


async def _refused(exc: ConfigError) -> AsyncIterator[ModelOutput]:
    """A stream that fails as soon as it is read: a model string no provider can serve."""
    raise PermanentModelError(str(exc)) from exc
    yield  # an async generator, so the error comes when the stream is read, as a provider's does


@dataclass(slots=True)
class ModelRouter:
    """A `ModelProvider` that serves each request with the provider its `model` names.

    `default_model` serves requests whose model is empty. A request naming a model that
    does not parse, or one whose provider cannot be built (a `bedrock:` model without
    boto3 or a region), fails with `PermanentModelError`: retrying cannot fix either.
    A default model of that kind refuses to start (`ConfigError`).
    """

    settings: ProviderSettings
    default_model: str
    script: Sequence[ScriptRule] = ()
    _openai: AsyncOpenAI | None = None
    _anthropic: AsyncAnthropic | None = None
    _bedrock: BedrockRuntimeClient | None = None
    _scripted: ScriptedModel | None = None
    _served: dict[str, ModelInfo] = field(default_factory=dict)
    _providers: dict[str, ModelProvider] = field(default_factory=dict)  # by model string

    def __post_init__(self) -> None:
        # Refuse to start on a bad default, or one whose API this process cannot reach; and
        # import the default's SDK now, not in the first completion: importing `anthropic`
        # takes 1.5 s here, which would hold up the stage's loop and every stream on it.
        default = parse_model(self.default_model)
        match default.backend:
            case Backend.BEDROCK:
                self.provider(default)
            case Backend.OPENAI:
                openai_adapter()
            case Backend.ANTHROPIC:
                anthropic_adapter()
            case Backend.SCRIPTED:
                pass

    def models(self) -> tuple[ModelInfo, ...]:
        default = self.provider(parse_model(self.default_model)).models()
        return (*default, *(m for m in self._served.values() if m not in default))

    def provider(self, ref: ModelRef) -> ModelProvider:
        """The provider for `ref`, sharing one client per API."""
        match ref.backend:
            case Backend.OPENAI:
                openai, openai_client = openai_adapter()
                if self._openai is None:
                    self._openai = openai_client(self.settings.openai)
                return openai(self._openai, ref.name, self.settings.openai)
            case Backend.ANTHROPIC:
                anthropic, anthropic_client = anthropic_adapter()
                if self._anthropic is None:
                    self._anthropic = anthropic_client(self.settings.anthropic)
                return anthropic(self._anthropic, ref.name, self.settings.anthropic)
            case Backend.BEDROCK:
                provider, client = bedrock_adapter()
                if self._bedrock is None:
                    self._bedrock = client(self.settings.bedrock)
                return provider(self._bedrock, ref.name, self.settings.bedrock)
            case Backend.SCRIPTED:
                # One instance, so its cursors (which turn comes next) outlive a request.
                if self._scripted is None:
                    self._scripted = ScriptedModel(self.script)
                return self._scripted

    def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        # The provider's own stream, not one re-yielded through a generator of ours (a step
        # more per chunk); the provider chosen once per model string (parsing, building).
        model = request.model or self.default_model
        provider = self._providers.get(model)
        if provider is None:
            try:
                provider = self.provider(parse_model(model))
            except ConfigError as exc:
                return _refused(exc)
            for info in provider.models():
                self._served.setdefault(info.name, info)
            if len(self._providers) >= PROVIDERS_KEPT:
                self._providers.clear()
            self._providers[model] = provider
        return provider.complete(request)

    async def aclose(self) -> None:
        """Close the API clients (their connection pools). The router may be used again after."""
        self._providers.clear()  # they hold the clients closed here
        if self._openai is not None:
            await self._openai.close()
            self._openai = None
        if self._anthropic is not None:
            await self._anthropic.close()
            self._anthropic = None
        if self._bedrock is not None:
            self._bedrock.close()  # a quick, local close of its connection pool
            self._bedrock = None
