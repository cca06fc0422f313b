"""Torpor history <-> the Anthropic Messages wire format (pure: no client, no I/O).

Requests. `anthropic_messages(history, supports_images)` spells the turns of
`turns.conversation` as alternating user and assistant messages (adjacent turns of one
role are merged into one message, as the API expects):

- user text and images as `text` and base64 `image` blocks (an image of a type the API
  does not take becomes a note; empty text blocks, which the API refuses, are dropped);
- an assistant turn as its signed `thinking` blocks first (the API verifies them and
  needs them back on a tool-use turn), then text, then `tool_use` blocks;
  an unsigned `ThinkingBlock` (from another provider) cannot be verified and is dropped;
- a run of results as one user message of `tool_result` blocks with `is_error`.

The system prompt goes in the request's `system` field, not in the messages.

Redacted thinking. The API may return a `redacted_thinking` block (opaque `data`, no
text) that must be sent back verbatim. `ThinkingBlock` has no field for it, so it is
kept as `ThinkingBlock(text="", signature=REDACTED + data)` and turned back here.

Responses. `MessageTurn` folds the raw stream events (`message_start`,
`content_block_*`, `message_delta`, `message_stop`) into one `Finished`: text, thinking
with its signature, tool calls with their streamed JSON input, and usage (input tokens
counting cache reads and writes, output tokens from the last `message_delta`, which also
updates the input counts it carries). A stream
without `message_stop` is not a turn: `finished()` raises `IncompleteStreamError`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

from anthropic.types import (
    ContentBlockParam,
    ImageBlockParam,
    MessageParam,
    RawMessageStreamEvent,
    TextBlockParam,
    ToolParam,
)

from torpor.processors.models.provider import Finished
from torpor.processors.models.providers.blocks import StreamedBlock, tool_input, unsupported_image
from torpor.processors.models.providers.errors import IncompleteStreamError
from torpor.processors.models.providers.turns import Answered, Results, Said, conversation
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

REDACTED: Final = "redacted_thinking:"
EMPTY: Final = "(no content)"
"""The text of a message or result with none: the API refuses empty content."""

MediaType = Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
_MEDIA_TYPES: Final[dict[str, MediaType]] = {
    "image/jpeg": "image/jpeg",
    "image/png": "image/png",
    "image/gif": "image/gif",
    "image/webp": "image/webp",
}


def _image(block: ImageBlock) -> TextBlockParam | ImageBlockParam:
    media = _MEDIA_TYPES.get(block.media_type)
    if media is None:
        return {"type": "text", "text": unsupported_image(block)}
    source: ImageBlockParam = {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": media,
            "data": base64.b64encode(block.data).decode("ascii"),
        },
    }
    return source


def _blocks(content: Iterable[ContentBlock]) -> list[TextBlockParam | ImageBlockParam]:
    out: list[TextBlockParam | ImageBlockParam] = []
    for block in content:
        if isinstance(block, TextBlock):
            if block.text:
                out.append({"type": "text", "text": block.text})
        else:
            out.append(_image(block))
    return out


def _assistant(turn: Answered) -> list[ContentBlockParam]:
    out: list[ContentBlockParam] = []
    for block in turn.content:
        if isinstance(block, ThinkingBlock) and block.signature:
            if block.signature.startswith(REDACTED):
                out.append({"type": "redacted_thinking", "data": block.signature.removeprefix(REDACTED)})
            else:
                out.append({"type": "thinking", "thinking": block.text, "signature": block.signature})
    out.extend({"type": "text", "text": b.text} for b in turn.content if isinstance(b, TextBlock) and b.text)
    out.extend(
        {"type": "tool_use", "id": c.call_id, "name": c.name, "input": tool_input(c.arguments)}
        for c in turn.tool_calls
    )
    return out


def _results(turn: Results) -> list[ContentBlockParam]:
    return [
        {
            "type": "tool_result",
            "tool_use_id": r.call_id,
            "content": _blocks(r.content) or [{"type": "text", "text": EMPTY}],
            "is_error": not r.ok,
        }
        for r in turn.results
    ]


def anthropic_messages(history: Iterable[HistoryEntry], supports_images: bool) -> list[MessageParam]:
    """The `messages` of a Messages request for `history` (module docstring)."""
    merged: list[tuple[Literal["user", "assistant"], list[ContentBlockParam]]] = []
    for turn in conversation(history, supports_images):
        blocks: list[ContentBlockParam] = []
        role: Literal["user", "assistant"] = "user"
        match turn:
            case Said():
                blocks.extend(_blocks(turn.content))
            case Answered():
                role = "assistant"
                blocks.extend(_assistant(turn))
            case Results():
                blocks.extend(_results(turn))
        if merged and merged[-1][0] == role:
            merged[-1][1].extend(blocks)
        else:
            merged.append((role, blocks))
    messages: list[MessageParam] = []
    for role, blocks in merged:
        if not blocks:
            blocks.append({"type": "text", "text": EMPTY})
        if role == "user":
            messages.append({"role": "user", "content": blocks})
        else:
            messages.append({"role": "assistant", "content": blocks})
    return messages


def anthropic_tools(tools: Iterable[ToolSpec]) -> list[ToolParam]:
    """`tools` as custom tools. Raises `ValueError` if a spec's parameters are not JSON."""
    return [
        {"name": t.name, "description": t.description, "input_schema": json.loads(t.parameters)}
        for t in tools
    ]


@dataclass(slots=True)
class MessageTurn:
    """One streamed message being assembled; `add` each event, then `finished()`."""

    model: str
    blocks: dict[int, StreamedBlock] = field(default_factory=dict)
    # The three parts of the input, kept apart because a `message_delta` may update any
    # of them (cumulative counts; a null one leaves the last value standing).
    uncached_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    output_tokens: int = 0
    stop_reason: str | None = None
    stopped: bool = False

    def add(self, event: RawMessageStreamEvent) -> str | None:
        """Take `event` in; return its text delta, if it has one."""
        match event.type:
            case "message_start":
                message = event.message
                self.model = message.model or self.model
                u = message.usage
                self.uncached_tokens = u.input_tokens
                self.cache_write_tokens = u.cache_creation_input_tokens or 0
                self.cache_read_tokens = u.cache_read_input_tokens or 0
                self.output_tokens = u.output_tokens
            case "content_block_start":
                start = event.content_block
                block = StreamedBlock(start.type)
                if start.type == "tool_use":
                    block.call_id, block.name = start.id, start.name
                    block.start_input = json.dumps(start.input) if start.input else "{}"
                elif start.type == "thinking":
                    block.text.append(start.thinking)
                    block.signature = start.signature or None
                elif start.type == "redacted_thinking":
                    block.signature = REDACTED + start.data
                elif start.type == "text":
                    block.text.append(start.text)
                self.blocks[event.index] = block
            case "content_block_delta":
                block = self.blocks.setdefault(event.index, StreamedBlock(event.delta.type))
                delta = event.delta
                if delta.type == "text_delta":
                    block.text.append(delta.text)
                    return delta.text or None
                if delta.type == "thinking_delta":
                    block.text.append(delta.thinking)
                elif delta.type == "signature_delta":
                    block.signature = (block.signature or "") + delta.signature
                elif delta.type == "input_json_delta":
                    block.text.append(delta.partial_json)
            case "message_delta":
                self.stop_reason = event.delta.stop_reason or self.stop_reason
                # Cumulative, so the last one is the turn's count. The input counts come
                # again when they changed during the turn (server tools): take them too.
                d = event.usage
                self.output_tokens = d.output_tokens
                if d.input_tokens is not None:
                    self.uncached_tokens = d.input_tokens
                if d.cache_creation_input_tokens is not None:
                    self.cache_write_tokens = d.cache_creation_input_tokens
                if d.cache_read_input_tokens is not None:
                    self.cache_read_tokens = d.cache_read_input_tokens
            case "message_stop":
                self.stopped = True
            case _:
                pass
        return None

    @property
    def input_tokens(self) -> int:
        """What the context held: uncached input plus cache writes and cache reads."""
        return self.uncached_tokens + self.cache_write_tokens + self.cache_read_tokens

    def finished(self) -> Finished:
        """The whole turn. Raises `IncompleteStreamError` if `message_stop` never arrived."""
        if not self.stopped:
            raise IncompleteStreamError("the message stream ended without message_stop")
        content: list[AssistantBlock] = []
        calls: list[ToolCall] = []
        for _, block in sorted(self.blocks.items()):
            if block.kind == "text":
                text = "".join(block.text)
                if text:
                    content.append(TextBlock(text))
            elif block.kind in ("thinking", "redacted_thinking"):
                content.append(ThinkingBlock("".join(block.text), block.signature))
            elif block.kind == "tool_use":
                calls.append(ToolCall(block.call_id, block.name, "".join(block.text) or block.start_input))
        usage = Usage(self.input_tokens, self.output_tokens, self.input_tokens + self.output_tokens)
        return Finished(tuple(content), tuple(calls), usage, self.model)
