"""The model seam: `ModelProvider`, and `ScriptedModel`, its deterministic twin.

A provider answers a `CompletionRequest` (provider-neutral: the model-visible history
entries, the system prompt and the tool specs) with an async stream of `TextDelta`s
ended by exactly one `Finished`. It raises `TransientModelError` for what a retry may
cure (rate limits, timeouts, 5xx) and `PermanentModelError` for what it will not (bad
request, unknown model); the model stage retries only the first, with bounded backoff.
Providers translate history entries into their own message format themselves
(OpenAI, Anthropic and Bedrock adapters are a later issue; this interface is their seam).

`ScriptedModel` is for tests, local runs and benchmarks. Its script is a list of rules;
a request is served by the first rule whose predicates hold (thread id, the thread's
kind, text in the entries the model is answering), and each (rule, thread) pair walks that rule's
turns in order. A request id that was already served gets the same turn again, so a
retried or re-issued request is answered identically, the way the model is never
"called twice" for one request id. Tool call ids derive from the request id. The
request ids it remembers are the last `REMEMBERED_REQUESTS` (a retry or a re-issue
follows its first attempt within seconds), so a long run does not grow the heap by every
completion it ever served; what stays per thread is one cursor per rule it matched.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from torpor.schemas.errors import RetriableError, TorporError
from torpor.schemas.frozen import fast_inits
from torpor.schemas.ids import derive_id
from torpor.schemas.records import (
    AssistantBlock,
    AssistantEntry,
    EventEntry,
    HistoryEntry,
    ParentLink,
    SummaryEntry,
    TextBlock,
    ToolCall,
    ToolResultEntry,
    ToolSpec,
    Usage,
    UserEntry,
)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A model a provider serves: its context window (tokens) and whether it reads images."""

    name: str
    context_window: int
    supports_images: bool


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """One completion to compute, provider-neutral. `request_id` is the idempotency key."""

    request_id: str
    thread_id: str
    model: str
    system_prompt: str
    history: tuple[HistoryEntry, ...]
    tools: tuple[ToolSpec, ...]
    parent: ParentLink | None


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Live output, shown to observers as an ephemeral event; never enters history."""

    text: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The whole turn: what becomes the `Completion` input."""

    content: tuple[AssistantBlock, ...]
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    model: str


ModelOutput = TextDelta | Finished


class ModelError(TorporError):
    """A provider failed a request. `kind` names the class for the error Completion."""

    kind = "model_error"


class TransientModelError(ModelError, RetriableError):
    """Retry the same request after a backoff (rate limit, timeout, overload).

    `retry_after_s` is the provider's own hint (a rate limit's `retry-after`), if it gave
    one: the stage waits at least that long, within its bound.
    """

    kind = "transient"
    retry_after_s: float | None = None


class PermanentModelError(ModelError):
    """Retrying will not help (bad request, unknown model): fail the completion."""

    kind = "permanent"


class ModelProvider(Protocol):
    """Implemented by `ScriptedModel` (and, later, the OpenAI, Anthropic, Bedrock adapters)."""

    def models(self) -> tuple[ModelInfo, ...]:
        """The models this provider serves."""
        ...

    def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        """Stream deltas, then one `Finished`. Raises `ModelError` subclasses."""
        ...


# --- the scripted model -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    """A tool call the scripted model makes: `arguments` is JSON text."""

    name: str
    arguments: str = "{}"


@dataclass(frozen=True, slots=True)
class ScriptedTurn:
    """One scripted answer. `chunks` is the text as streamed (joined, it is the text).

    `transient_failures` makes the first N attempts at this turn raise
    `TransientModelError`; `permanent_failure` makes every attempt raise
    `PermanentModelError`. `delay_s` is spent before the first chunk (and between
    chunks, split evenly), to exercise a slow model.
    """

    chunks: tuple[str, ...] = ()
    tool_calls: tuple[ScriptedCall, ...] = ()
    usage: Usage | None = None
    transient_failures: int = 0
    permanent_failure: bool = False
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ScriptRule:
    """Which requests a rule serves (every given predicate must hold) and its turns.

    `thread`: the thread id, exactly. `thread_prefix`: the thread id starts with it.
    `kind`: the thread's ParentLink kind (`root` for a thread without a parent, `child`,
    `event`, `compaction`). `last_contains`: text in what the model is answering, i.e. the
    entries after its last turn (`recent_text`).
    """

    turns: tuple[ScriptedTurn, ...]
    thread: str | None = None
    thread_prefix: str | None = None
    kind: str | None = None
    last_contains: str | None = None

    def is_match(self, request: CompletionRequest) -> bool:
        kind = request.parent.kind if request.parent is not None else "root"
        return (
            (self.thread is None or self.thread == request.thread_id)
            and (self.thread_prefix is None or request.thread_id.startswith(self.thread_prefix))
            and (self.kind is None or self.kind == kind)
            # The text is gathered only for a rule that asks for it (a walk of the history).
            and (self.last_contains is None or self.last_contains in recent_text(request.history))
        )


EXHAUSTED = ScriptedTurn(chunks=("(the script has no more turns for this thread)",))
"""What a thread gets once its rule has run out of turns (or no rule matches): plain text,
so the thread goes idle instead of hanging."""


def recent_text(history: Sequence[HistoryEntry]) -> str:
    """The text of the entries after the last `AssistantEntry`: what the model must answer.

    A turn may be answered by several entries at once (a child sees its own spawn result
    and its siblings'; an interrupted call's result precedes the user's text), so
    matching only the very last entry would be brittle. With nothing after the last
    turn, it is that turn's text.
    """
    recent: list[str] = []
    for entry in reversed(history):
        if isinstance(entry.body, AssistantEntry):
            if not recent:
                recent.append(entry_text(entry))
            break
        recent.append(entry_text(entry))
    return "\n".join(reversed(recent))


def entry_text(entry: HistoryEntry) -> str:
    """The plain text of an entry, for matching (images and reasoning left out)."""
    body = entry.body
    match body:
        case UserEntry() | ToolResultEntry() | EventEntry():
            return " ".join(b.text for b in body.content if isinstance(b, TextBlock))
        case AssistantEntry():
            return " ".join(b.text for b in body.content if isinstance(b, TextBlock))
        case SummaryEntry():
            return body.text


REMEMBERED_REQUESTS: Final = 10_000
"""Request ids `ScriptedModel` remembers (its turn, its attempts), least recent forgotten."""


@dataclass(slots=True)
class _Served:
    """What a request id was answered with, and how many attempts it has made."""

    rule: int
    turn: ScriptedTurn
    attempts: int = 0


@dataclass(slots=True)
class ScriptedModel:
    """A deterministic `ModelProvider` driven by `rules` (see the module docstring)."""

    rules: Sequence[ScriptRule]
    name: str = "scripted"
    context_window: int = 200_000
    # Answers what no rule does (or a rule whose turns ran out); a pure function of the
    # request, so it stays deterministic. None: the EXHAUSTED text.
    fallback: Callable[[CompletionRequest], ScriptedTurn] | None = None
    _cursors: dict[tuple[int, str], int] = field(default_factory=dict)
    _served: OrderedDict[str, _Served] = field(default_factory=OrderedDict)

    def models(self) -> tuple[ModelInfo, ...]:
        return (ModelInfo(self.name, self.context_window, supports_images=False),)

    def turn_for(self, request: CompletionRequest) -> ScriptedTurn:
        """The turn that answers `request` (the same one for a repeated request id)."""
        return self._served_for(request).turn

    def _served_for(self, request: CompletionRequest) -> _Served:
        served = self._served.get(request.request_id)
        if served is not None:
            self._served.move_to_end(request.request_id)
            return served
        for index, rule in enumerate(self.rules):
            if rule.is_match(request):
                cursor = self._cursors.get((index, request.thread_id), 0)
                self._cursors[(index, request.thread_id)] = cursor + 1
                turn = rule.turns[cursor] if cursor < len(rule.turns) else self._fallback(request)
                break
        else:
            index, turn = -1, self._fallback(request)
        served = self._served[request.request_id] = _Served(index, turn)
        if len(self._served) > REMEMBERED_REQUESTS:
            self._served.popitem(last=False)
        return served

    def _fallback(self, request: CompletionRequest) -> ScriptedTurn:
        return EXHAUSTED if self.fallback is None else self.fallback(request)

    async def complete(self, request: CompletionRequest) -> AsyncIterator[ModelOutput]:
        served = self._served_for(request)
        turn, attempt = served.turn, served.attempts
        served.attempts += 1
        if turn.permanent_failure:
            raise PermanentModelError(f"scripted permanent failure for request {request.request_id}")
        if attempt < turn.transient_failures:
            raise TransientModelError(
                f"scripted transient failure {attempt + 1} of {turn.transient_failures}"
                f" for {request.request_id}"
            )
        pause = turn.delay_s / max(1, len(turn.chunks))
        for chunk in turn.chunks:
            if pause:
                await asyncio.sleep(pause)
            yield TextDelta(chunk)
        if not turn.chunks and turn.delay_s:
            await asyncio.sleep(turn.delay_s)
        text = "".join(turn.chunks)
        calls = tuple(
            ToolCall(derive_id(request.request_id, "call", str(i)), call.name, call.arguments)
            for i, call in enumerate(turn.tool_calls)
        )
        usage = turn.usage or _estimated_usage(request, text, calls)
        yield Finished((TextBlock(text),) if text else (), calls, usage, request.model or self.name)


def _estimated_usage(request: CompletionRequest, text: str, calls: tuple[ToolCall, ...]) -> Usage:
    # A rough four characters per token, so context-window logic sees growing numbers.
    prompt = len(request.system_prompt) + sum(len(entry_text(e)) for e in request.history)
    output = len(text) + sum(len(c.arguments) + len(c.name) for c in calls)
    return Usage(prompt // 4 + 1, output // 4 + 1, prompt // 4 + output // 4 + 2)


# Built per input or per completion: a faster __init__, same signature (torpor.schemas.frozen).
fast_inits(__name__)
