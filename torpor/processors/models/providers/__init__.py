"""Model providers behind the `torpor.processors.models.provider.ModelProvider` seam.

- `openai_compat.OpenAICompatProvider`: OpenAI and every OpenAI-compatible server
  (vLLM, Ollama, llama.cpp, LiteLLM), streaming chat completions with tools;
- `anthropic_provider.AnthropicProvider`: Anthropic Messages, with tool use and extended
  thinking (signatures kept);
- `bedrock_provider.BedrockProvider`: Amazon Bedrock's Converse API (`converse_stream`
  through boto3, an optional extra: `pip install 'torpor[bedrock]'`; imported only when a
  `bedrock:` model is first used, so it is not re-exported here);
- `registry.ModelRouter` / `provider_for`: pick one by a model string
  (`openai:gpt-4o-mini`, `anthropic:claude-...`, `bedrock:<model id>`, `scripted`) from
  `settings.ProviderSettings`.

How history is shown to a model is pure and lives apart from the clients:
`turns` (the provider-neutral conversation), `mapping_openai`, `mapping_anthropic`,
`mapping_bedrock`, and `blocks` (what the last two share).
Failures are classified in `errors` (extending the seam's `TransientModelError` and
`PermanentModelError`); `stall` bounds how long a stream may stay silent.
"""

from __future__ import annotations

from torpor.processors.models.providers.anthropic_provider import AnthropicProvider
from torpor.processors.models.providers.errors import (
    IncompleteStreamError,
    RateLimitedError,
    StreamStalledError,
)
from torpor.processors.models.providers.openai_compat import OpenAICompatProvider
from torpor.processors.models.providers.registry import (
    Backend,
    ModelRef,
    ModelRouter,
    parse_model,
    provider_for,
)
from torpor.processors.models.providers.settings import EndpointSettings, ProviderSettings

__all__ = [
    "AnthropicProvider",
    "Backend",
    "EndpointSettings",
    "IncompleteStreamError",
    "ModelRef",
    "ModelRouter",
    "OpenAICompatProvider",
    "ProviderSettings",
    "RateLimitedError",
    "StreamStalledError",
    "parse_model",
    "provider_for",
]
