"""Model-visible history as a conversation every chat API accepts (pure, provider-neutral).

`conversation(history, supports_images)` turns `HistoryEntry`s into `Turn`s, the
shape both adapters then spell in their own wire format:

- `UserEntry` -> `Said`; a `SummaryEntry` -> `Said` with `SUMMARY_HEADER` and its text
  (the visible history starts there, so the model reads it as the conversation so far);
- `AssistantEntry` -> `Answered` (text, reasoning, every tool call);
- the `ToolResultEntry`s answering that turn's calls -> one `Results` right after it,
  which is what both APIs require (OpenAI: a run of tool messages; Anthropic: one user
  message of tool_result blocks);
- `EventEntry` -> an `Answered` holding one synthetic `receive_event__injected` call
  (arguments `original_tool_name`, `original_tool_call_id`, `original_args`) plus the
  `Results` holding its content, keyed by the event's own `call_id`.

Invariants kept so a request is never refused for its shape: every call in an `Answered`
is answered by the `Results` that follows it (a call with no recorded result gets
`NO_RESULT`, an error); an event that lands while a turn's calls are still open is shown
after that turn's results, not between them; a result whose call is not visible (cut off
by compaction) becomes plain user text, since an API rejects a result for an unknown
call. Images become `IMAGE_OMITTED` text for a model without image input.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from torpor.schemas.jsontext import parse_json
from torpor.schemas.records import (
    INJECTED_TOOL,
    AssistantBlock,
    AssistantEntry,
    ContentBlock,
    EventEntry,
    HistoryEntry,
    ImageBlock,
    SummaryEntry,
    TextBlock,
    ToolCall,
    ToolResultEntry,
    UserEntry,
)

SUMMARY_HEADER: Final = "[Compacted conversation summary]"
IMAGE_OMITTED: Final = "[image omitted: the current model does not support image inputs]"
NO_RESULT: Final = "[no result was recorded for this call]"
ERROR_PREFIX: Final = "[tool error] "
"""How a failed result reads where the API has no error flag (OpenAI tool messages)."""


@dataclass(frozen=True, slots=True)
class Said:
    """A user-side message."""

    content: tuple[ContentBlock, ...]


@dataclass(frozen=True, slots=True)
class Answered:
    """An assistant message: text and reasoning blocks, then tool calls."""

    content: tuple[AssistantBlock, ...]
    tool_calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class Result:
    """The result of call `call_id`; `ok=False` marks an error."""

    call_id: str
    name: str
    ok: bool
    content: tuple[ContentBlock, ...]


@dataclass(frozen=True, slots=True)
class Results:
    """Every result of the preceding `Answered`, in the order of its calls."""

    results: tuple[Result, ...]


Turn = Said | Answered | Results


def injected_arguments(entry: EventEntry) -> str:
    """The JSON arguments of the synthetic call for `entry` (original args inlined if JSON)."""
    try:
        original: object = parse_json(entry.original_args) if entry.original_args else {}
    except ValueError:
        original = entry.original_args
    return json.dumps(
        {
            "original_tool_name": entry.original_tool_name,
            "original_tool_call_id": entry.original_tool_call_id,
            "original_args": original,
        },
        sort_keys=True,
    )


def visible_content(content: Iterable[ContentBlock], supports_images: bool) -> tuple[ContentBlock, ...]:
    """`content` as the model may see it: images replaced by `IMAGE_OMITTED` if it cannot."""
    if supports_images:
        return tuple(content)
    return tuple(TextBlock(IMAGE_OMITTED) if isinstance(b, ImageBlock) else b for b in content)


@dataclass(slots=True)
class _Open:
    """The latest assistant turn whose calls still await their results."""

    calls: tuple[ToolCall, ...]
    results: dict[str, Result] = field(default_factory=dict)
    held: list[Turn] = field(default_factory=list)  # event pairs shown after the results

    def is_answered(self) -> bool:
        return all(c.call_id in self.results for c in self.calls)

    def close(self) -> list[Turn]:
        ordered = tuple(
            self.results.get(c.call_id) or Result(c.call_id, c.name, False, (TextBlock(NO_RESULT),))
            for c in self.calls
        )
        return [Results(ordered), *self.held]


def conversation(history: Iterable[HistoryEntry], supports_images: bool) -> tuple[Turn, ...]:
    """The turns for `history` (see the module docstring for the rules)."""
    turns: list[Turn] = []
    open_turn: _Open | None = None

    def close() -> None:
        nonlocal open_turn
        if open_turn is not None:
            turns.extend(open_turn.close())
            open_turn = None

    for entry in history:
        body = entry.body
        match body:
            case ToolResultEntry() if open_turn is not None and any(
                c.call_id == body.call_id for c in open_turn.calls
            ):
                content = visible_content(body.content, supports_images)
                open_turn.results[body.call_id] = Result(body.call_id, body.name, body.ok, content)
                if open_turn.is_answered() and not open_turn.held:
                    close()
            case ToolResultEntry():
                close()
                status = "result" if body.ok else "error"
                note = (
                    f"[{status} of tool call {body.name} ({body.call_id}), made before the visible history]"
                )
                turns.append(Said((TextBlock(note), *visible_content(body.content, supports_images))))
            case EventEntry():
                call = ToolCall(body.call_id, INJECTED_TOOL, injected_arguments(body))
                result = Result(
                    body.call_id, INJECTED_TOOL, True, visible_content(body.content, supports_images)
                )
                pair: list[Turn] = [Answered((), (call,)), Results((result,))]
                if open_turn is not None and not open_turn.is_answered():
                    open_turn.held.extend(pair)
                else:
                    close()
                    turns.extend(pair)
            case AssistantEntry():
                close()
                turns.append(Answered(body.content, body.tool_calls))
                if body.tool_calls:
                    open_turn = _Open(body.tool_calls)
            case UserEntry():
                close()
                turns.append(Said(visible_content(body.content, supports_images)))
            case SummaryEntry():
                close()
                turns.append(Said((TextBlock(f"{SUMMARY_HEADER}\n{body.text}"),)))
    close()
    return tuple(turns)
