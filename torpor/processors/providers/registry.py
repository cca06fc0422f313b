"""Choosing a provider by a model string, and routing each request to the right one.

A model string names the API and the model: `openai:gpt-4o-mini` (any OpenAI-compatible
server: the `openai` endpoint's base URL decides which), `anthropic:claude-sonnet-4-5`,
or `scripted` (the deterministic `ScriptedModel`, for tests and local runs).
`parse_model` splits and checks one; a wrong one is a `ConfigError` at startup, not a
failed completion later.

`provider_for(model, settings, script)` builds the provider for one model string.
`ModelRouter` is the `ModelProvider` the model stage gets: it routes every request by
its own `request.model` (a thread may be switched to another model with `set_model`),
building each API's client once, on first use, and `aclose()` closes them.
Settings come in as `ProviderSettings`; nothing here reads the environment.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from torpor.processors.model import (
    CompletionRequest,
    ModelInfo,
    ModelOutput,
    ModelProvider,
    PermanentModelError,
    ScriptedModel,
    ScriptRule,
)
from torpor.processors.providers.anthropic_provider import AnthropicProvider, anthropic_client
from torpor.processors.providers.openai_compat import OpenAICompatProvider, openai_client
from torpor.processors.providers.settings import ProviderSettings
from torpor.schemas.errors import ConfigError


class Backend(StrEnum):
    """The APIs Torpor speaks, spelled as in model strings."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"
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
            "server), anthropic:<model> or scripted"
        ) from None
    if backend is Backend.SCRIPTED:
        return ModelRef(backend, name or "scripted")
    if not sep or not name:
        raise ConfigError(f"model {model!r}: name the model after the provider, e.g. {head}:<model>")
    return ModelRef(backend, name)


def provider_for(model: str, settings: ProviderSettings, script: Sequence[ScriptRule] = ()) -> ModelProvider:
    """A provider serving `model`, with its own client. Raises `ConfigError` for a bad string."""
    ref = parse_model(model)
    match ref.backend:
        case Backend.OPENAI:
            return OpenAICompatProvider(openai_client(settings.openai), ref.name, settings.openai)
        case Backend.ANTHROPIC:
            return AnthropicProvider(anthropic_client(settings.anthropic), ref.name, settings.anthropic)
        case Backend.SCRIPTED:
            return ScriptedModel(script)


@dataclass(slots=True)
class ModelRouter:
    """A `ModelProvider` that serves each request with the provider its `model` names.

    `default_model` serves requests whose model is empty. A request naming a model that
    does not parse fails with `PermanentModelError` (retrying cannot fix its name).
    """

    settings: ProviderSettings
    default_model: str
    script: Sequence[ScriptRule] = ()
    _openai: AsyncOpenAI | None = None
    _anthropic: AsyncAnthropic | None = None
    _scripted: ScriptedModel | None = None
    _served: dict[str, ModelInfo] = field(default_factory=dict)

    def __post_init__(self) -> None:
        parse_model(self.default_model)  # refuse to start on a bad default

    def models(self) -> tuple[ModelInfo, ...]:
        default = self.provider(parse_model(self.default_model)).models()
        return (*default, *(m for m in self._served.values() if m not in default))

    def provider(self, ref: ModelRef) -> ModelProvider:
        """The provider for `ref`, sharing one client per API."""
        match ref.backend:
            case Backend.OPENAI:
                if self._openai is None:
                    self._openai = openai_client(self.settings.openai)
                return OpenAICompatProvider(self._openai, ref.name, self.settings.openai)
            case Backend.ANTHROPIC:
                if self._anthropic is None:
                    self._anthropic = anthropic_client(self.settings.anthropic)
                return AnthropicProvider(self._anthropic, ref.name, self.settings.anthropic)
            case Backend.SCRIPTED:
                # One instance, so its cursors (which turn comes next) outlive a request.
                if self._scripted is None:
                    self._scripted = ScriptedModel(self.script)
                return self._scripted

    async def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        try:
            ref = parse_model(request.model or self.default_model)
        except ConfigError as exc:
            raise PermanentModelError(str(exc)) from exc
        provider = self.provider(ref)
        for info in provider.models():
            self._served.setdefault(info.name, info)
        async for output in provider.complete(request):
            yield output

    async def aclose(self) -> None:
        """Close the API clients (their connection pools). The router may be used again after."""
        if self._openai is not None:
            await self._openai.close()
            self._openai = None
        if self._anthropic is not None:
            await self._anthropic.close()
            self._anthropic = None
