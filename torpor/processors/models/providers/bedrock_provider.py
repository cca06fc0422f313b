"""`BedrockProvider`: a `ModelProvider` for Amazon Bedrock's Converse API (boto3 `bedrock-runtime`).

Contract of `complete(request)`:

- calls `ConverseStream` (`POST {endpoint}/model/{model id}/converse-stream`) with the
  system prompt, the history (`mapping_bedrock`), the tool config, `maxTokens` if
  configured and, with a thinking budget, Anthropic-style extended thinking through
  `additionalModelRequestFields`;
- yields a `TextDelta` per text fragment (reasoning is not live output), then exactly one
  `Finished`: reasoning with its signatures, text, every tool call, usage from the
  `metadata` event, and the model as `bedrock:<model id>` (Converse does not report one);
- raises `RateLimitedError` (`ThrottlingException`, `ServiceQuotaExceededException`, as
  an HTTP error or an exception event inside the stream), `TransientModelError` (5xx,
  `InternalServerException`, `ModelStreamErrorException`, `ServiceUnavailableException`,
  connection errors and timeouts), `StreamStalledError` (nothing within `stall_timeout_s`),
  `IncompleteStreamError` (the stream broke off, or ended without `messageStop`), or
  `PermanentModelError` (`ValidationException`, `AccessDeniedException`,
  `ResourceNotFoundException`, other 4xx, no AWS credentials, a tool spec whose parameters
  are not JSON). A failure discards the partial turn.

boto3 is synchronous, so the call and the reading of its stream run on a thread of
their own (`_StreamThread`), handing each event to the event loop through a queue: the
model stage's loop never blocks on Bedrock, and one slow stream never holds a worker of
the loop's shared executor. Closing the generator (the stage cancelled it, a stall, an
error) interrupts the HTTP stream, which ends the thread at once.

boto3's own retries are off (one attempt): the model stage owns retrying. Credentials
come from boto3's standard chain; the region and endpoint URL from `BedrockSettings`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import boto3
import botocore.config
import botocore.exceptions

from torpor.processors.models.provider import (
    CompletionRequest,
    ModelError,
    ModelInfo,
    ModelOutput,
    PermanentModelError,
    TextDelta,
    TransientModelError,
)
from torpor.processors.models.providers.errors import IncompleteStreamError, classify_bedrock
from torpor.processors.models.providers.mapping_bedrock import ConverseTurn, converse_messages, converse_tools
from torpor.processors.models.providers.settings import BedrockSettings, api_model_name
from torpor.processors.models.providers.stall import within
from torpor.schemas.errors import ConfigError

if TYPE_CHECKING:
    from botocore.eventstream import EventStream
    from mypy_boto3_bedrock_runtime import BedrockRuntimeClient
    from mypy_boto3_bedrock_runtime.type_defs import (
        ConverseStreamOutputTypeDef,
        ConverseStreamRequestTypeDef,
        ConverseStreamResponseTypeDef,
    )

PREFIX: Final = "bedrock"
# Room for the answer beside a thinking budget, which Converse counts inside maxTokens.
THINKING_HEADROOM_TOKENS: Final = 4096
# Connections one client keeps for reuse; each streaming completion holds one, and past
# this many they are still opened, just not kept.
MAX_POOL_CONNECTIONS: Final = 64


def bedrock_client(settings: BedrockSettings) -> BedrockRuntimeClient:
    """The `bedrock-runtime` client for `settings`: explicit region, one attempt per call.

    Raises `ConfigError` without a region: boto3 would otherwise guess one from the
    environment and the shared config, and what runs must be what the settings say.
    """
    if settings.region is None:
        raise ConfigError("a bedrock: model needs a region: set --bedrock-region (or TORPOR_BEDROCK_REGION)")
    endpoint = settings.endpoint
    config = botocore.config.Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=endpoint.connect_timeout_s,
        # A backstop behind the stall guard, which is the real bound (and whose give-up
        # interrupts the read at once); this one only matters where that cannot.
        read_timeout=endpoint.stall_timeout_s * 2,
        max_pool_connections=MAX_POOL_CONNECTIONS,
    )
    return boto3.session.Session().client(
        "bedrock-runtime", region_name=settings.region, endpoint_url=endpoint.base_url, config=config
    )


def translate(exc: Exception, midstream: bool = False) -> ModelError:
    """The model error for a botocore exception (see the module docstring).

    `midstream`: raised while reading the stream, where a broken connection means the
    turn broke off rather than that Bedrock is unreachable.
    """
    if isinstance(exc, botocore.exceptions.ClientError):
        error: Any = exc.response.get("Error", {})
        meta: Any = exc.response.get("ResponseMetadata", {})
        # An exception event inside a stream carries no HTTP status of its own.
        status = None if isinstance(exc, botocore.exceptions.EventStreamError) else meta.get("HTTPStatusCode")
        return classify_bedrock(
            str(error.get("Code", "")), str(error.get("Message", "")), status, meta.get("HTTPHeaders", {})
        )
    if isinstance(exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
        return PermanentModelError(f"no AWS credentials for Bedrock in boto3's standard chain: {exc}")
    if isinstance(exc, botocore.exceptions.ParamValidationError):
        return PermanentModelError(f"boto3 refused the Converse request: {exc}")
    if midstream:  # botocore lets urllib3's errors through while a stream is read
        return IncompleteStreamError(f"the Converse stream broke off: {type(exc).__name__}: {exc}")
    if isinstance(exc, botocore.exceptions.BotoCoreError | OSError):  # connection errors and timeouts
        return TransientModelError(f"cannot reach Bedrock: {type(exc).__name__}: {exc}")
    return TransientModelError(f"the Converse stream failed: {type(exc).__name__}: {exc}")


class _End:
    """Put on the queue after the last event: the stream ended by itself."""


@dataclass(slots=True)
class _StreamThread:
    """Runs one blocking `converse_stream` call and reads its stream, off the event loop.

    Each event (or the exception that ended the stream, or `_End`) reaches `queue` through
    `loop.call_soon_threadsafe`. `close()` is called from the loop; it interrupts the
    HTTP stream, so a read blocked on the socket returns and the thread ends.
    """

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[ConverseStreamOutputTypeDef | Exception | _End] = field(
        default_factory=asyncio.Queue
    )
    closed: threading.Event = field(default_factory=threading.Event)
    stream: EventStream[ConverseStreamOutputTypeDef] | None = None

    def start(self, call: Callable[[], ConverseStreamResponseTypeDef], name: str) -> None:
        threading.Thread(target=self._run, args=(call,), name=name, daemon=True).start()

    def _run(self, call: Callable[[], ConverseStreamResponseTypeDef]) -> None:
        try:
            if self.closed.is_set():  # given up on before it started: do not call
                return
            self.stream = call()["stream"]
            if not self.closed.is_set():  # else closed while the call was opening: nobody reads
                for event in self.stream:
                    self._put(event)
                self._put(_End())
        except Exception as exc:
            if not self.closed.is_set():
                self._put(exc)
        finally:
            # Closed here, on the thread that reads it (see `close`).
            if self.stream is not None:
                self.stream.close()

    def _put(self, item: ConverseStreamOutputTypeDef | Exception | _End) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.closed.set()

    def close(self) -> None:
        """Stop reading, from the loop, without waiting for the thread.

        Closing the HTTP response from here would block on the buffer lock that the
        thread's pending read holds; shutting the socket's read side down instead makes
        that read return at once (urllib3's `HTTPResponse.shutdown`), and the thread then
        closes the stream itself. A stream that is not open yet is closed by the thread
        when its call returns.
        """
        self.closed.set()
        response = getattr(self.stream, "_raw_stream", None)  # botocore keeps urllib3's response there
        shutdown = getattr(response, "shutdown", None)
        if shutdown is not None:
            with contextlib.suppress(ValueError, RuntimeError, OSError):  # already closed or released
                shutdown()


@dataclass(frozen=True, slots=True)
class BedrockProvider:
    """Serves `model` (a Bedrock model id or inference profile) and any `bedrock:<id>` request."""

    client: BedrockRuntimeClient
    model: str
    settings: BedrockSettings

    def models(self) -> tuple[ModelInfo, ...]:
        endpoint = self.settings.endpoint
        return (ModelInfo(f"{PREFIX}:{self.model}", endpoint.context_window, endpoint.supports_images),)

    def api_model(self, requested: str) -> str:
        """Bedrock's model id for `requested` (`bedrock:<id>`), or our own model for anything else."""
        return api_model_name(PREFIX, requested, self.model)

    def arguments(self, request: CompletionRequest, model: str) -> ConverseStreamRequestTypeDef:
        """The `converse_stream` arguments for `request`. Raises `PermanentModelError` for a bad tool."""
        endpoint = self.settings.endpoint
        messages = converse_messages(request.history, endpoint.supports_images)
        try:
            tools = converse_tools(request.tools, messages)
        except ValueError as exc:
            raise PermanentModelError(f"a tool's parameters are not JSON: {exc}") from exc
        arguments: ConverseStreamRequestTypeDef = {"modelId": model, "messages": messages}
        if request.system_prompt:
            arguments["system"] = [{"text": request.system_prompt}]
        if tools is not None:
            arguments["toolConfig"] = tools
        budget = endpoint.thinking_budget_tokens
        limit = endpoint.max_output_tokens or (budget + THINKING_HEADROOM_TOKENS if budget else None)
        if limit is not None:
            arguments["inferenceConfig"] = {"maxTokens": limit}
        if budget:
            arguments["additionalModelRequestFields"] = {
                "thinking": {"type": "enabled", "budget_tokens": budget}
            }
        return arguments

    async def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        model = self.api_model(request.model)
        what = f"bedrock stream for {request.request_id} ({model})"
        arguments = self.arguments(request, model)
        reader = _StreamThread(asyncio.get_running_loop())
        turn = ConverseTurn(model=f"{PREFIX}:{model}")
        try:
            # Started from a worker: `Thread.start` waits for the new thread to run, which
            # under a burst of streams (a rebalance re-issuing every waiting request) held
            # the loop for ~4 ms a stream, 0.8 s for 200.
            await asyncio.to_thread(
                reader.start,
                lambda: self.client.converse_stream(**arguments),
                f"bedrock {request.request_id}",
            )
            while True:
                item = await within(reader.queue.get(), self.settings.endpoint.stall_timeout_s, what)
                if isinstance(item, _End):
                    break
                if isinstance(item, Exception):
                    # Once the call returned, a failure is the stream breaking off.
                    raise translate(item, midstream=reader.stream is not None) from item
                text = turn.add(item)
                if text:
                    yield TextDelta(text)
        finally:
            # Closed before `Finished` is yielded: the caller may stop iterating there.
            reader.close()
        yield turn.finished()
