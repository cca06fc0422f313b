"""`OpenAICompatProvider`: a `ModelProvider` for any OpenAI-compatible chat completions API.

OpenAI itself, vLLM, Ollama, llama.cpp's server and LiteLLM all speak
`POST {base_url}/chat/completions` with `stream: true`; this adapter drives them through
the official `openai.AsyncOpenAI` client.

Contract of `complete(request)`:

- yields a `TextDelta` per streamed text fragment, then exactly one `Finished` (text,
  unsigned reasoning if the server streams any, every tool call, usage from the
  `include_usage` chunk, and the model as `openai:<the model the server reports>`);
- raises `RateLimitedError` (429, with the server's retry-after), `TransientModelError`
  (5xx, connection errors, timeouts, a mid-stream error event that is not about the
  request), `StreamStalledError` (no chunk within `stall_timeout_s`),
  `IncompleteStreamError` (the stream ended without a finish reason), or
  `PermanentModelError` (400, 401, 403, 404, 422, a tool spec whose parameters are not
  JSON). A partial turn is never yielded as `Finished`: a failure discards it.

The client's own retries are off (`max_retries=0`): the model stage owns retrying, with
backoff and an event per attempt; two layers of retries would hide both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final

import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionChunk

from torpor.processors.models.provider import (
    CompletionRequest,
    ModelError,
    ModelInfo,
    ModelOutput,
    PermanentModelError,
    TextDelta,
    TransientModelError,
)
from torpor.processors.models.providers.errors import IncompleteStreamError, classify_status
from torpor.processors.models.providers.mapping_openai import ChatTurn, chat_messages, chat_tools
from torpor.processors.models.providers.settings import EndpointSettings, api_model_name
from torpor.processors.models.providers.stall import within

PREFIX: Final = "openai"
DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"
# Error types of a mid-stream error event that say the request itself is wrong.
_PERMANENT_TYPES: Final = frozenset({"invalid_request_error", "authentication_error", "permission_error"})


def openai_client(settings: EndpointSettings) -> AsyncOpenAI:
    """The client for `settings`: explicit key and URL, no client-side retries."""
    return AsyncOpenAI(
        api_key=settings.key(),
        base_url=settings.base_url or DEFAULT_BASE_URL,
        max_retries=0,
        # The read timeout is a backstop below our stall guard, which is the real bound.
        timeout=openai.Timeout(settings.stall_timeout_s * 2, connect=settings.connect_timeout_s),
    )


def translate(exc: openai.OpenAIError, midstream: bool = False) -> ModelError:
    """The model error for a client exception (see the module docstring).

    `midstream`: raised while reading the body, where a connection error means the
    stream broke off rather than that the server is unreachable.
    """
    if isinstance(exc, openai.APIStatusError):
        return classify_status(exc.status_code, exc.message, exc.response.headers)
    if isinstance(exc, openai.APIConnectionError):  # timeouts included
        cause = f"{type(exc.__cause__).__name__}: {exc.__cause__}" if exc.__cause__ else exc.message
        if midstream:
            return IncompleteStreamError(f"the stream broke off before its end: {cause}")
        return TransientModelError(f"cannot reach the model server: {cause}")
    if isinstance(exc, openai.APIError) and exc.type in _PERMANENT_TYPES:
        return PermanentModelError(f"the server refused the request mid-stream: {exc.message}")
    # An error event inside a stream, a malformed response: the server's trouble, not ours.
    return TransientModelError(f"the model server failed the stream: {exc}")


@dataclass(frozen=True, slots=True)
class OpenAICompatProvider:
    """Serves `model` (the API's model name) and any `openai:<name>` request, via `client`."""

    client: AsyncOpenAI
    model: str
    settings: EndpointSettings

    def models(self) -> tuple[ModelInfo, ...]:
        return (
            ModelInfo(f"{PREFIX}:{self.model}", self.settings.context_window, self.settings.supports_images),
        )

    def api_model(self, requested: str) -> str:
        """The API's name for `requested` (`openai:<name>`), or our own model for anything else."""
        return api_model_name(PREFIX, requested, self.model)

    async def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        model = self.api_model(request.model)
        what = f"openai-compatible stream for {request.request_id} ({model})"
        try:
            tools = chat_tools(request.tools)
        except ValueError as exc:
            raise PermanentModelError(f"a tool's parameters are not JSON: {exc}") from exc
        messages = chat_messages(request.system_prompt, request.history, self.settings.supports_images)
        limit = self.settings.max_output_tokens
        try:
            stream = await within(
                self.client.chat.completions.create(
                    model=model,
                    messages=messages,
                    tools=tools or openai.omit,
                    stream=True,
                    stream_options={"include_usage": True},
                    max_completion_tokens=limit if limit is not None else openai.omit,
                ),
                self.settings.stall_timeout_s,
                what,
            )
        except openai.OpenAIError as exc:
            raise translate(exc) from exc
        turn = ChatTurn(model=model)
        try:
            while True:
                try:
                    chunk: ChatCompletionChunk = await within(
                        anext(stream), self.settings.stall_timeout_s, what
                    )
                except StopAsyncIteration:
                    break
                text = turn.add(chunk)
                if text:
                    yield TextDelta(text)
        except openai.OpenAIError as exc:
            raise translate(exc, midstream=True) from exc
        finally:
            # Closed before `Finished` is yielded: the caller may stop iterating there.
            await stream.close()
        finished = turn.finished(fallback_call_id=f"{request.request_id}-call")
        yield dataclasses.replace(finished, model=f"{PREFIX}:{finished.model}")
