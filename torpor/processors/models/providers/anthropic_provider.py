"""`AnthropicProvider`: a `ModelProvider` for Anthropic's Messages API (`anthropic.AsyncAnthropic`).

Contract of `complete(request)`:

- sends `POST {base_url}/v1/messages` with `stream: true`, the system prompt, the
  history (`mapping_anthropic`), the tools, `max_tokens` and, if configured, extended
  thinking with its budget;
- yields a `TextDelta` per text fragment (thinking is not live output), then exactly one
  `Finished`: thinking blocks with their signatures, text, every tool call, usage, and the
  model as `anthropic:<the model the API reports>`;
- raises `RateLimitedError` (429 or `rate_limit_error`, with retry-after; 529 or
  `overloaded_error`, also mid-stream), `TransientModelError` (5xx, `api_error`,
  connection errors, timeouts, a dropped stream), `StreamStalledError` (no event within
  `stall_timeout_s`; the API's pings do not count), `IncompleteStreamError` (no
  `message_stop`), or `PermanentModelError` (400, 401, 403, 404, 413, and their error
  types). A failure discards the partial turn.

The client's own retries are off (`max_retries=0`): the model stage owns retrying.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

import anthropic
import httpx2
from anthropic import AsyncAnthropic
from anthropic.types import RawMessageStreamEvent

from torpor.processors.models.provider import (
    CompletionRequest,
    ModelError,
    ModelInfo,
    ModelOutput,
    PermanentModelError,
    TextDelta,
    TransientModelError,
)
from torpor.processors.models.providers.errors import (
    IncompleteStreamError,
    RateLimitedError,
    classify_status,
    retry_after_s,
)
from torpor.processors.models.providers.mapping_anthropic import (
    MessageTurn,
    anthropic_messages,
    anthropic_tools,
)
from torpor.processors.models.providers.settings import EndpointSettings, api_model_name
from torpor.processors.models.providers.stall import within

PREFIX: Final = "anthropic"
DEFAULT_BASE_URL: Final = "https://api.anthropic.com"
# The API requires max_tokens; this fits every current model's output limit.
ANTHROPIC_DEFAULT_MAX_TOKENS: Final = 8192
# Error types (the body's `error.type`), which name the cause even inside a stream,
# where the HTTP status is the stream's 200.
_RATE_LIMITED: Final = frozenset({"rate_limit_error", "overloaded_error"})
_TRANSIENT: Final = frozenset({"api_error", "timeout_error"})
_PERMANENT: Final = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
    }
)


def anthropic_client(settings: EndpointSettings) -> AsyncAnthropic:
    """The client for `settings`: explicit key and URL (so no environment), no client retries."""
    return AsyncAnthropic(
        api_key=settings.key(),
        base_url=settings.base_url or DEFAULT_BASE_URL,
        max_retries=0,
        # The read timeout is a backstop below our stall guard, which is the real bound.
        timeout=anthropic.Timeout(settings.stall_timeout_s * 2, connect=settings.connect_timeout_s),
    )


def translate(exc: anthropic.AnthropicError | httpx2.HTTPError, *, mid_stream: bool = False) -> ModelError:
    """The model error for a client exception (see the module docstring).

    `mid_stream`: raised while reading events of a stream that had started. A connection
    failure there means the stream broke off, whether the client wraps it (anthropic 2.x:
    `APIConnectionError`, "incomplete chunked read") or not (earlier: the bare
    `httpx2` error).
    """
    if isinstance(exc, httpx2.HTTPError) or (mid_stream and isinstance(exc, anthropic.APIConnectionError)):
        return IncompleteStreamError(f"the message stream broke off: {type(exc).__name__}: {exc}")
    if isinstance(exc, anthropic.APIStatusError):
        message = exc.api_message or exc.message
        if exc.type in _RATE_LIMITED:
            return RateLimitedError(f"{exc.type}: {message}", retry_after_s(exc.response.headers))
        if exc.type in _TRANSIENT:
            return TransientModelError(f"{exc.type}: {message}")
        if exc.type in _PERMANENT:
            return PermanentModelError(f"{exc.type} ({exc.status_code}): {message}")
        return classify_status(exc.status_code, message, exc.response.headers)
    if isinstance(exc, anthropic.APIConnectionError):  # timeouts included
        return TransientModelError(f"cannot reach the Anthropic API: {exc.message}")
    if isinstance(exc, anthropic.APIError):
        return TransientModelError(f"the Anthropic API failed the stream: {exc.message}")
    return PermanentModelError(f"the Anthropic client refused the request: {exc}")


@dataclass(frozen=True, slots=True)
class AnthropicProvider:
    """Serves `model` (the API's model name) and any `anthropic:<name>` request, via `client`."""

    client: AsyncAnthropic
    model: str
    settings: EndpointSettings

    def models(self) -> tuple[ModelInfo, ...]:
        return (
            ModelInfo(f"{PREFIX}:{self.model}", self.settings.context_window, self.settings.supports_images),
        )

    def api_model(self, requested: str) -> str:
        """The API's name for `requested` (`anthropic:<name>`), or our own model for anything else."""
        return api_model_name(PREFIX, requested, self.model)

    async def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        model = self.api_model(request.model)
        what = f"anthropic stream for {request.request_id} ({model})"
        settings = self.settings
        try:
            tools = anthropic_tools(request.tools)
        except ValueError as exc:
            raise PermanentModelError(f"a tool's parameters are not JSON: {exc}") from exc
        budget = settings.thinking_budget_tokens
        max_tokens = settings.max_output_tokens or max(ANTHROPIC_DEFAULT_MAX_TOKENS, (budget or 0) + 4096)
        try:
            stream = await within(
                self.client.messages.create(
                    model=model,
                    max_tokens=max_tokens,
                    messages=anthropic_messages(request.history, settings.supports_images),
                    system=request.system_prompt or anthropic.omit,
                    tools=tools or anthropic.omit,
                    thinking={"type": "enabled", "budget_tokens": budget} if budget else anthropic.omit,
                    stream=True,
                ),
                settings.stall_timeout_s,
                what,
            )
        except (anthropic.AnthropicError, httpx2.HTTPError) as exc:
            raise translate(exc) from exc
        turn = MessageTurn(model=model)
        try:
            while True:
                try:
                    event: RawMessageStreamEvent = await within(anext(stream), settings.stall_timeout_s, what)
                except StopAsyncIteration:
                    break
                text = turn.add(event)
                if text:
                    yield TextDelta(text)
        except (anthropic.AnthropicError, httpx2.HTTPError) as exc:
            raise translate(exc, mid_stream=True) from exc
        finally:
            # Closed before `Finished` is yielded: the caller may stop iterating there.
            await stream.close()
        finished = turn.finished()
        yield dataclasses.replace(finished, model=f"{PREFIX}:{finished.model}")
