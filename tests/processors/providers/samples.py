"""Histories and requests for the provider tests: one of every entry kind, and a runner."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from torpor.processors.models.provider import CompletionRequest, Finished, ModelOutput, TextDelta
from torpor.schemas.records import (
    AssistantEntry,
    EventEntry,
    HistoryBody,
    HistoryEntry,
    ImageBlock,
    SummaryEntry,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultEntry,
    ToolSpec,
    Usage,
    UserEntry,
)

T = TypeVar("T")

PNG = b"\x89PNG\r\n\x1a\nfake"
WEATHER = ToolSpec(
    name="get_weather",
    description="The weather in a city.",
    parameters=json.dumps(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ),
    result_schema=None,
    passive=False,
    toolset=None,
)
USAGE = Usage(10, 5, 15)


def plain(value: object) -> Any:
    """`value` as JSON data: API params are TypedDict unions no test wants to narrow."""
    return json.loads(json.dumps(value))


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def history(*bodies: HistoryBody) -> tuple[HistoryEntry, ...]:
    return tuple(
        HistoryEntry(seq=i, created_at=1_000 + i, input_id=f"in-{i}", body=b) for i, b in enumerate(bodies)
    )


def request(
    entries: tuple[HistoryEntry, ...],
    model: str = "",
    system: str = "Be brief.",
    tools: tuple[ToolSpec, ...] = (),
) -> CompletionRequest:
    return CompletionRequest(
        request_id="req-1",
        thread_id="t-1",
        model=model,
        system_prompt=system,
        history=entries,
        tools=tools,
        parent=None,
    )


def user(text: str, *images: bytes) -> UserEntry:
    return UserEntry((TextBlock(text), *(ImageBlock("image/png", i) for i in images)), interrupt=False)


def assistant(text: str = "", *calls: ToolCall, thinking: ThinkingBlock | None = None) -> AssistantEntry:
    content = (*((thinking,) if thinking else ()), *((TextBlock(text),) if text else ()))
    return AssistantEntry(content, calls, "openai:gpt-4o-mini", USAGE)


def result(call_id: str, text: str, ok: bool = True, name: str = "get_weather") -> ToolResultEntry:
    return ToolResultEntry(call_id, name, ok, (TextBlock(text),), "tool")


def event(call_id: str = "ev-1", text: str = "Report from child thread: done") -> EventEntry:
    return EventEntry(
        call_id, "child_report", "spawn_thread", "call-spawn", '{"task": "look"}', (TextBlock(text),)
    )


SUMMARY = SummaryEntry("The user asked about Paris.", up_to_seq=7)


async def collect(stream: AsyncIterator[ModelOutput]) -> tuple[list[str], Finished]:
    """The text deltas and the one `Finished` of a stream (which must end with it)."""
    deltas: list[str] = []
    finished: Finished | None = None
    async for output in stream:
        assert finished is None, "nothing may follow Finished"
        if isinstance(output, TextDelta):
            deltas.append(output.text)
        else:
            finished = output
    assert finished is not None, "the stream ended without Finished"
    return deltas, finished
