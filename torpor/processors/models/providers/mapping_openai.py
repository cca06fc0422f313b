"""Torpor history <-> the OpenAI Chat Completions wire format (pure: no client, no I/O).

Requests. `chat_messages(system_prompt, history, supports_images)` spells the turns of
`turns.conversation` as chat messages: the system prompt as a `system` message (what
vLLM, Ollama, llama.cpp and LiteLLM all accept; `developer` is OpenAI-only); user text as
a plain string when it is only text (some local servers take no content arrays), else
text and `image_url` parts with a base64 data URL; an assistant turn as its text and
`function` tool calls (reasoning is dropped: chat completions has no field to send it
back in); each result as a `tool` message, text only, a failed one prefixed with
`ERROR_PREFIX` since the API has no error flag. Tool messages cannot hold images, so the
images of a run of results follow it in one user message, after every tool message
(a user message among them would orphan the remaining calls).

Responses. `ChatTurn` folds a stream of `ChatCompletionChunk`s into one `Finished`:
text deltas, parallel tool calls assembled by their `index`, reasoning that servers like
vLLM and DeepSeek send as `reasoning_content` (kept as an unsigned `ThinkingBlock`), the
finish reason and the usage chunk (`stream_options.include_usage`). A stream without a
finish reason is not a turn: `finished()` raises `IncompleteStreamError`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from openai.types.chat import (
    ChatCompletionChunk,
    ChatCompletionContentPartParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)

from torpor.processors.models.provider import Finished
from torpor.processors.models.providers.errors import IncompleteStreamError
from torpor.processors.models.providers.turns import (
    ERROR_PREFIX,
    Answered,
    Result,
    Results,
    Said,
    conversation,
)
from torpor.schemas.records import (
    AssistantBlock,
    ContentBlock,
    HistoryEntry,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolSpec,
    Usage,
)

EMPTY_RESULT = "(no output)"
"""The text of a result with no text: some servers refuse an empty tool message."""


def data_url(image: ImageBlock) -> str:
    return f"data:{image.media_type};base64,{base64.b64encode(image.data).decode('ascii')}"


def _text(content: Iterable[ContentBlock]) -> str:
    return "\n".join(b.text for b in content if isinstance(b, TextBlock))


def _user(content: tuple[ContentBlock, ...]) -> ChatCompletionMessageParam:
    if all(isinstance(b, TextBlock) for b in content):
        return {"role": "user", "content": _text(content)}
    parts: list[ChatCompletionContentPartParam] = []
    for block in content:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        else:
            parts.append({"type": "image_url", "image_url": {"url": data_url(block)}})
    return {"role": "user", "content": parts}


def _assistant(turn: Answered) -> ChatCompletionMessageParam:
    text = "".join(b.text for b in turn.content if isinstance(b, TextBlock))
    if not turn.tool_calls:
        return {"role": "assistant", "content": text}
    calls: list[ChatCompletionMessageFunctionToolCallParam] = [
        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or "{}"}}
        for c in turn.tool_calls
    ]
    # `content: None` rather than "" with tool calls: what the API itself returns.
    return {"role": "assistant", "content": text or None, "tool_calls": calls}


def _tool(result: Result) -> ChatCompletionMessageParam:
    text = _text(result.content) or EMPTY_RESULT
    return {
        "role": "tool",
        "tool_call_id": result.call_id,
        "content": text if result.ok else ERROR_PREFIX + text,
    }


def _result_images(results: Results) -> ChatCompletionMessageParam | None:
    parts: list[ChatCompletionContentPartParam] = []
    for result in results.results:
        images = [b for b in result.content if isinstance(b, ImageBlock)]
        if images:
            parts.append(
                {"type": "text", "text": f"[images from the result of {result.name} ({result.call_id})]"}
            )
            parts.extend({"type": "image_url", "image_url": {"url": data_url(i)}} for i in images)
    return {"role": "user", "content": parts} if parts else None


def chat_messages(
    system_prompt: str, history: Iterable[HistoryEntry], supports_images: bool
) -> list[ChatCompletionMessageParam]:
    """The `messages` of a chat completion request for `history` (module docstring)."""
    messages: list[ChatCompletionMessageParam] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    for turn in conversation(history, supports_images):
        match turn:
            case Said(content=content):
                messages.append(_user(content))
            case Answered():
                messages.append(_assistant(turn))
            case Results(results=results):
                messages.extend(_tool(r) for r in results)
                images = _result_images(turn)
                if images is not None:
                    messages.append(images)
    return messages


def chat_tools(tools: Iterable[ToolSpec]) -> list[ChatCompletionFunctionToolParam]:
    """`tools` as function tools. Raises `ValueError` if a spec's parameters are not JSON."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": json.loads(t.parameters),
            },
        }
        for t in tools
    ]


@dataclass(slots=True)
class _PartialCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ChatTurn:
    """One streamed turn being assembled; `add` each chunk, then `finished()`."""

    model: str
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Usage | None = None

    def add(self, chunk: ChatCompletionChunk) -> str | None:
        """Take `chunk` in; return its text delta, if it has one."""
        if chunk.model:
            self.model = chunk.model
        if chunk.usage is not None:
            u = chunk.usage
            self.usage = Usage(u.prompt_tokens, u.completion_tokens, u.total_tokens)
        delta_text: list[str] = []
        # Only choice 0: Torpor never asks for n > 1.
        # `or ()` and `getattr`: the client builds chunks without validation, and some
        # compatible servers send `choices: null` or leave out a choice's index.
        for choice in (c for c in chunk.choices or () if getattr(c, "index", 0) in (0, None)):
            delta = choice.delta
            if delta.content:
                self.text.append(delta.content)
                delta_text.append(delta.content)
            extra = delta.model_extra or {}
            thought = extra.get("reasoning_content") or extra.get("reasoning")
            if isinstance(thought, str) and thought:
                self.reasoning.append(thought)
            for fragment in delta.tool_calls or ():
                call = self.calls.setdefault(
                    self._slot(fragment.id, getattr(fragment, "index", None)), _PartialCall()
                )
                if fragment.id:
                    call.call_id = fragment.id
                if fragment.function is not None:
                    if fragment.function.name:
                        call.name += fragment.function.name
                    if fragment.function.arguments:
                        call.arguments.append(fragment.function.arguments)
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
        return "".join(delta_text) or None

    def _slot(self, call_id: str | None, index: int | None) -> int:
        """Where a tool call fragment goes: its index, or (servers that send none, like older
        Ollama) a new slot for a fragment with an id, else the latest call."""
        if index is not None:
            return index
        if call_id or not self.calls:
            return max(self.calls, default=-1) + 1
        return max(self.calls)

    def finished(self, fallback_call_id: str) -> Finished:
        """The whole turn. Raises `IncompleteStreamError` if no finish reason arrived.

        A call the server streamed without an id (some local servers do) gets
        `fallback_call_id` plus its index, so every call can be answered.
        """
        if self.finish_reason is None:
            raise IncompleteStreamError("the chat completion stream ended without a finish_reason")
        content: list[AssistantBlock] = []
        if self.reasoning:
            content.append(ThinkingBlock("".join(self.reasoning), None))
        if self.text:
            content.append(TextBlock("".join(self.text)))
        calls = tuple(
            ToolCall(c.call_id or f"{fallback_call_id}-{i}", c.name, "".join(c.arguments) or "{}")
            for i, c in sorted(self.calls.items())
        )
        # Servers that ignore include_usage report nothing; zeros say "unknown" honestly
        # enough for the context-window logic, which then relies on its own estimate.
        usage = self.usage or Usage(0, 0, 0)
        return Finished(tuple(content), calls, usage, self.model)
