"""Torpor history <-> the Bedrock Converse wire format (pure: no client, no I/O).

Requests. `converse_messages(history, supports_images)` spells the turns of
`turns.conversation` as alternating `user` and `assistant` messages (adjacent turns of
one role become one message, and the first is a user message, as Converse requires):

- user text and images as `text` and `image` blocks (raw bytes: boto3 encodes them); an
  image of a format Converse does not take becomes a note; empty text, which Converse
  refuses as blank, is dropped;
- an assistant turn as its signed `reasoningContent` blocks first (a model verifies them
  and needs them back on a tool-use turn), then text, then `toolUse` blocks; an
  unsigned `ThinkingBlock` (from another provider) cannot be verified and is dropped;
- a run of results as one user message of `toolResult` blocks, a failed one with
  `status: "error"`.

The system prompt goes in the request's `system` field. `converse_tools(tools, history)`
is the `toolConfig`: Converse refuses `toolUse` and `toolResult` blocks in a request that
has none, so when the thread grants no tools but its history shows calls (the synthetic
`receive_event__injected` pairs, a tool since revoked), those names are declared with an
open schema. A model that calls one anyway gets the fold's answer for an unknown or
reserved tool; it cannot bypass it.

Redacted reasoning. Converse may return `reasoningContent.redactedContent` (opaque
bytes, no text) that must go back verbatim. `ThinkingBlock` has no field for it, so it
is kept as `ThinkingBlock(text="", signature=REDACTED + base64 of the bytes)`.

Responses. `ConverseTurn` folds the stream events (`messageStart`,
`contentBlockStart/Delta/Stop`, `messageStop`, `metadata`) into one `Finished`: text,
reasoning with its signature, tool calls with their streamed JSON input, and usage
from `metadata` (input counting cache reads and writes). A stream without `messageStop`
is not a turn: `finished()` raises `IncompleteStreamError`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

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

if TYPE_CHECKING:
    from mypy_boto3_bedrock_runtime.literals import ImageFormatType
    from mypy_boto3_bedrock_runtime.type_defs import (
        ContentBlockDeltaTypeDef,
        ContentBlockTypeDef,
        ConverseStreamOutputTypeDef,
        MessageTypeDef,
        ToolConfigurationTypeDef,
        ToolResultContentBlockTypeDef,
        ToolSpecificationTypeDef,
        ToolTypeDef,
    )

REDACTED: Final = "bedrock_redacted:"
BLANK: Final = "(no content)"
"""The text of a message or result with none: Converse refuses blank text and empty content."""
OPENING: Final = "(the conversation so far follows)"
"""The user message put first when the history opens with an assistant turn (an event
that reached a thread before any user text): Converse refuses a conversation that does
not start with a user message."""
UNGRANTED: Final = "Not available in this conversation any more; do not call it."
"""The description of a tool declared only because the history shows calls to it."""

OPEN_SCHEMA: Final = {"type": "object"}

_FORMATS: Final[dict[str, ImageFormatType]] = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}

Role = Literal["user", "assistant"]


def _image(block: ImageBlock) -> ContentBlockTypeDef:
    image_format = _FORMATS.get(block.media_type)
    if image_format is None:
        return {"text": unsupported_image(block)}
    return {"image": {"format": image_format, "source": {"bytes": block.data}}}


def _said(content: Iterable[ContentBlock]) -> list[ContentBlockTypeDef]:
    return [
        {"text": block.text} if isinstance(block, TextBlock) else _image(block)
        for block in content
        if not isinstance(block, TextBlock) or block.text
    ]


def _result_content(content: Iterable[ContentBlock]) -> list[ToolResultContentBlockTypeDef]:
    out: list[ToolResultContentBlockTypeDef] = []
    for block in _said(content):
        if "image" in block:
            out.append({"image": block["image"]})
        else:
            out.append({"text": block.get("text", BLANK)})
    return out or [{"text": BLANK}]


def _reasoning(block: ThinkingBlock) -> ContentBlockTypeDef | None:
    if not block.signature:
        return None
    if block.signature.startswith(REDACTED):
        opaque = base64.b64decode(block.signature.removeprefix(REDACTED))
        return {"reasoningContent": {"redactedContent": opaque}}
    return {"reasoningContent": {"reasoningText": {"text": block.text, "signature": block.signature}}}


def _answered(turn: Answered) -> list[ContentBlockTypeDef]:
    reasoning = [_reasoning(b) for b in turn.content if isinstance(b, ThinkingBlock)]
    out = [r for r in reasoning if r is not None]
    out.extend({"text": b.text} for b in turn.content if isinstance(b, TextBlock) and b.text)
    out.extend(
        {"toolUse": {"toolUseId": c.call_id, "name": c.name, "input": tool_input(c.arguments)}}
        for c in turn.tool_calls
    )
    return out


def _results(turn: Results) -> list[ContentBlockTypeDef]:
    return [
        {
            "toolResult": {
                "toolUseId": r.call_id,
                "content": _result_content(r.content),
                "status": "success" if r.ok else "error",
            }
        }
        for r in turn.results
    ]


def converse_messages(history: Iterable[HistoryEntry], supports_images: bool) -> list[MessageTypeDef]:
    """The `messages` of a Converse request for `history` (module docstring)."""
    messages: list[MessageTypeDef] = []
    for turn in conversation(history, supports_images):
        role: Role
        match turn:
            case Said():
                role, blocks = "user", _said(turn.content)
            case Answered():
                role, blocks = "assistant", _answered(turn)
            case Results():
                role, blocks = "user", _results(turn)
        if not messages and role == "assistant":
            messages.append({"role": "user", "content": [{"text": OPENING}]})
        if messages and messages[-1]["role"] == role:
            messages[-1] = {"role": role, "content": [*messages[-1]["content"], *blocks]}
        else:
            messages.append({"role": role, "content": blocks})
    return [m if m["content"] else {"role": m["role"], "content": [{"text": BLANK}]} for m in messages]


def _called_names(messages: Iterable[MessageTypeDef]) -> list[str]:
    names: dict[str, None] = {}  # ordered, so the request is the same bytes every time
    for message in messages:
        for block in message["content"]:
            if "toolUse" in block:
                names[block["toolUse"]["name"]] = None
    return list(names)


def converse_tools(
    tools: Iterable[ToolSpec], messages: Iterable[MessageTypeDef]
) -> ToolConfigurationTypeDef | None:
    """The `toolConfig` for `tools` and the calls in `messages`, or None (module docstring).

    Raises `ValueError` if a spec's parameters are not JSON.
    """
    specs: list[ToolTypeDef] = []
    for tool in tools:
        spec: ToolSpecificationTypeDef = {
            "name": tool.name,
            "inputSchema": {"json": json.loads(tool.parameters)},
        }
        if tool.description:  # optional, but never empty: boto3 refuses a blank one
            spec["description"] = tool.description
        specs.append({"toolSpec": spec})
    if not specs:
        specs = [
            {"toolSpec": {"name": name, "description": UNGRANTED, "inputSchema": {"json": OPEN_SCHEMA}}}
            for name in _called_names(messages)
        ]
    return {"tools": specs} if specs else None


@dataclass(slots=True)
class ConverseTurn:
    """One streamed Converse answer being assembled; `add` each event, then `finished()`."""

    model: str
    blocks: dict[int, StreamedBlock] = field(default_factory=dict)
    usage: Usage = field(default_factory=lambda: Usage(0, 0, 0))  # until `metadata` says
    stop_reason: str | None = None

    def add(self, event: ConverseStreamOutputTypeDef) -> str | None:
        """Take `event` in; return its text delta, if it has one."""
        if "contentBlockStart" in event:
            start = event["contentBlockStart"]
            use = start["start"].get("toolUse")
            if use is not None:
                block = StreamedBlock("tool_use", call_id=use["toolUseId"], name=use["name"])
                self.blocks[start["contentBlockIndex"]] = block
        elif "contentBlockDelta" in event:
            delta = event["contentBlockDelta"]
            return self._delta(delta["contentBlockIndex"], delta["delta"])
        elif "messageStop" in event:
            self.stop_reason = event["messageStop"]["stopReason"]
        elif "metadata" in event:
            u = event["metadata"]["usage"]
            prompt = u["inputTokens"] + u.get("cacheReadInputTokens", 0) + u.get("cacheWriteInputTokens", 0)
            self.usage = Usage(prompt, u["outputTokens"], prompt + u["outputTokens"])
        return None

    def _delta(self, index: int, delta: ContentBlockDeltaTypeDef) -> str | None:
        if "text" in delta:
            self.blocks.setdefault(index, StreamedBlock("text")).text.append(delta["text"])
            return delta["text"] or None
        if "toolUse" in delta:
            self.blocks.setdefault(index, StreamedBlock("tool_use")).text.append(delta["toolUse"]["input"])
        elif "reasoningContent" in delta:
            block = self.blocks.setdefault(index, StreamedBlock("reasoning"))
            reasoning = delta["reasoningContent"]
            block.text.append(reasoning.get("text", ""))
            if "signature" in reasoning:
                block.signature = (block.signature or "") + reasoning["signature"]
            if "redactedContent" in reasoning:
                block.signature = REDACTED + base64.b64encode(reasoning["redactedContent"]).decode("ascii")
        return None

    def finished(self) -> Finished:
        """The whole turn. Raises `IncompleteStreamError` if `messageStop` never arrived."""
        if self.stop_reason is None:
            raise IncompleteStreamError("the Converse stream ended without messageStop")
        content: list[AssistantBlock] = []
        calls: list[ToolCall] = []
        for _, block in sorted(self.blocks.items()):
            text = "".join(block.text)
            if block.kind == "tool_use":
                calls.append(ToolCall(block.call_id, block.name, text or block.start_input))
            elif block.kind == "reasoning":
                content.append(ThinkingBlock(text, block.signature))
            elif text:
                content.append(TextBlock(text))
        return Finished(tuple(content), tuple(calls), self.usage, self.model)
