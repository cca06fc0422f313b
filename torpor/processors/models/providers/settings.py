"""Settings of the model providers: one frozen, validated `EndpointSettings` per API.

The command line builds these (flags, `TORPOR_*` variables, the config file) and passes
them in; nothing in `providers/` reads `os.environ`. Because the vendor client libraries
*would* fall back to `OPENAI_API_KEY` / `ANTHROPIC_API_KEY` when given no key, the
adapters always pass one explicitly (`NO_KEY` for servers that need none), so what
runs is exactly what these settings say.

Bedrock is reached through boto3, whose credentials come from its standard chain (the
AWS variables, the shared config files, an instance or container role): `BedrockSettings`
holds where to go (region, endpoint URL) and never a credential.

The API key is a `Secret` (masked in every repr). A base URL carrying credentials is
refused rather than redacted: the key belongs in `api_key`, where it cannot leak into a
log line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from torpor.schemas.errors import ConfigError
from torpor.streams.config import Secret

NO_KEY: Final = "no-key"
"""Sent as the key to servers configured without one (local vLLM, Ollama, llama.cpp)."""

# Anthropic's smallest thinking budget; a smaller one is a 400 on every request.
MIN_THINKING_BUDGET: Final = 1024


@dataclass(frozen=True, slots=True)
class EndpointSettings:
    """How to reach one API and what its models can do.

    `base_url`: None for the vendor's own endpoint; for an OpenAI-compatible server, the
    URL up to and including `/v1` (e.g. `http://localhost:8000/v1` for vLLM,
    `http://localhost:11434/v1` for Ollama, `http://localhost:4000` for a LiteLLM proxy).
    """

    base_url: str | None = None
    api_key: Secret | None = None
    # No chunk for this long means the stream is stuck: retry. Generous, because reasoning
    # models may think for minutes before the first visible token on chat completions.
    stall_timeout_s: float = 180.0
    # Connecting is quick or it is broken; a dead host should fail fast and be retried.
    connect_timeout_s: float = 10.0
    # None: the server's own default (OpenAI-compatible); Anthropic requires a number and
    # gets `ANTHROPIC_DEFAULT_MAX_TOKENS`.
    max_output_tokens: int | None = None
    # What `models()` reports for a model of this endpoint; the fold compacts against it.
    context_window: int = 128_000
    # False: images are replaced by a placeholder text before the request is built.
    supports_images: bool = True
    # Anthropic extended thinking: the budget in tokens, or None for no thinking.
    thinking_budget_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.base_url is not None:
            parts = urlsplit(self.base_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"provider base_url {self.base_url!r} must be an http(s) URL with a host")
            if parts.username is not None or parts.password is not None:
                raise ConfigError("provider base_url must not carry credentials: set the api_key instead")
        for name in ("stall_timeout_s", "connect_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"provider {name} must be a positive number of seconds, not {value!r}")
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise ConfigError(f"provider max_output_tokens must be at least 1, not {self.max_output_tokens}")
        if self.context_window < 1:
            raise ConfigError(f"provider context_window must be at least 1, not {self.context_window}")
        budget = self.thinking_budget_tokens
        if budget is not None:
            if budget < MIN_THINKING_BUDGET:
                raise ConfigError(
                    f"thinking_budget_tokens must be at least {MIN_THINKING_BUDGET}, not {budget}"
                )
            if self.max_output_tokens is not None and budget >= self.max_output_tokens:
                raise ConfigError(
                    f"thinking_budget_tokens ({budget}) must be below "
                    f"max_output_tokens ({self.max_output_tokens})"
                )

    def key(self) -> str:
        """The key to hand the client library (never None, so it never reads the environment)."""
        return self.api_key.reveal() if self.api_key is not None else NO_KEY


# An AWS region name: `us-east-1`, `eu-central-2`, `us-gov-west-1`, `ap-southeast-7`.
_REGION: Final = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]+")


@dataclass(frozen=True, slots=True)
class BedrockSettings:
    """Where Bedrock runs. `endpoint` holds what every API has (timeouts, limits, thinking);
    its `base_url` is the endpoint URL override (a VPC endpoint, a proxy, a local stand-in),
    None for the region's own `bedrock-runtime` endpoint.

    `region` None is allowed here, since a processor that never serves a `bedrock:` model
    needs none; building the client without one is a `ConfigError`, not boto3's guess.
    """

    region: str | None = None
    endpoint: EndpointSettings = EndpointSettings()

    def __post_init__(self) -> None:
        if self.region is not None and not _REGION.fullmatch(self.region):
            raise ConfigError(f"bedrock region {self.region!r} is not an AWS region name such as us-east-1")
        if self.endpoint.api_key is not None:
            raise ConfigError("bedrock takes no api_key: boto3 finds AWS credentials in its standard chain")


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """The `[providers]` section: one endpoint per API. Defaults reach the vendors' own URLs."""

    openai: EndpointSettings = EndpointSettings()
    anthropic: EndpointSettings = EndpointSettings()
    bedrock: BedrockSettings = BedrockSettings()


def api_model_name(prefix: str, requested: str, default: str) -> str:
    """The API's model name for `requested` (`<prefix>:<name>`), or `default` for anything else.

    Shared by every adapter: a thread's model string names the provider first, and a
    request routed here without a name of ours is served by the endpoint's own model.
    """
    head, _, name = requested.partition(":")
    return name if head == prefix and name else default
