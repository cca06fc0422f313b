"""Model providers behind the `torpor.processors.models.provider.ModelProvider` seam.

- `openai_compat.OpenAICompatProvider`: OpenAI and every OpenAI-compatible server
  (vLLM, Ollama, llama.cpp, LiteLLM), streaming chat completions with tools;
- `anthropic_provider.AnthropicProvider`: Anthropic Messages, with tool use and extended
  thinking (signatures kept);
- `bedrock_provider.BedrockProvider`: Amazon Bedrock's Converse API (`converse_stream`
  through boto3, an optional extra: `pip install 'torpor[bedrock]'`);
- `registry.ModelRouter` / `provider_for`: pick one by a model string
  (`openai:gpt-4o-mini`, `anthropic:claude-...`, `bedrock:<model id>`, `scripted`) from
  `settings.ProviderSettings`.

How history is shown to a model is pure and lives apart from the clients:
`turns` (the provider-neutral conversation), `mapping_openai`, `mapping_anthropic`,
`mapping_bedrock`, and `blocks` (what the last two share).
Failures are classified in `errors` (extending the seam's `TransientModelError` and
`PermanentModelError`); `stall` bounds how long a stream may stay silent.

The three adapters are imported only when a model of their API is first served
(`registry`), so none is re-exported here: importing this package does not import the
`openai` or `anthropic` SDK (about 100 MiB of a process's memory).
"""

from __future__ import annotations

from torpor.processors.models.providers.errors import (
    IncompleteStreamError,
    RateLimitedError,
    StreamStalledError,
)
from torpor.processors.models.providers.registry import (
    Backend,
    ModelRef,
    ModelRouter,
    parse_model,
    provider_for,
)
from torpor.processors.models.providers.settings import EndpointSettings, ProviderSettings

__all__ = [
    "Backend",
    "EndpointSettings",
    "IncompleteStreamError",
    "ModelRef",
    "ModelRouter",
    "ProviderSettings",
    "RateLimitedError",
    "StreamStalledError",
    "parse_model",
    "provider_for",
]
