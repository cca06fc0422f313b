"""A readable transcript of a local run: one line per record, as records appear.

`Transcript` observes the local log (inputs, dispatches, events, receipts) and renders
each record as `+seconds thread kind text`. Threads get short names as they are
created: the root keeps its id, children become `<parent>/child-N`, event children
`<parent>/event-N`, compaction children `<parent>/compaction-N`. Live deltas are left
out unless asked for (the committed turn shows the same text).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from torpor.schemas.records import (
    ApprovalDecision,
    ApprovalRequest,
    ChildReport,
    Completion,
    Control,
    CreateThread,
    Dispatch,
    ImageBlock,
    Input,
    ParentMessage,
    Receipt,
    TextBlock,
    ThinkingBlock,
    ThreadEvent,
    TimerFired,
    ToolEvent,
    ToolResult,
    UserMessage,
)
from torpor.streams.log import LogRecord

WIDTH = 96


def _text(blocks: tuple[TextBlock | ImageBlock | ThinkingBlock, ...]) -> str:
    return " ".join(b.text if isinstance(b, TextBlock) else f"[{type(b).__name__}]" for b in blocks)


def printable(value: str) -> str:
    """`value` with every control character escaped (``\\n``, ``\\x1b``): what a record says
    can never start a line of its own or drive the terminal."""
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)


def short(value: str, width: int = WIDTH) -> str:
    """`value` on one line (whitespace runs collapsed, control characters escaped), cut to
    `width` characters with `…`."""
    value = printable(" ".join(value.split()))
    return value if len(value) <= width else value[: width - 1] + "…"


def with_data(text: str, data: object) -> str:
    """`text` followed by an event's JSON object `data` as sorted `key=value` pairs."""
    if not isinstance(data, dict):
        return text
    return " ".join(p for p in (text, " ".join(f"{k}={v}" for k, v in sorted(data.items()))) if p)


@dataclass(slots=True)
class Transcript:
    """Collects (and optionally prints) the lines of a run."""

    clock: Callable[[], int]
    emit: Callable[[str], None] | None = None
    deltas: bool = False
    lines: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    _counts: dict[tuple[str, str], int] = field(default_factory=dict)
    _start: int | None = None

    def name(self, thread_id: str) -> str:
        return self.names.get(thread_id, thread_id[:14])

    def observe(self, record: LogRecord[object]) -> None:
        value = record.value
        if isinstance(value, Input):
            self._input(value)
        elif isinstance(value, Dispatch):
            self._line(
                value.thread_id, "dispatch", f"{value.kind} {value.tool}({short(value.arguments, 60)})"
            )
        elif isinstance(value, ThreadEvent):
            self._event(value)
        elif isinstance(value, Receipt):
            detail = f" ({value.reason})" if value.reason else ""
            self._line(
                value.thread_id,
                "receipt",
                f"{value.disposition}{detail} input={value.input_id[:14]} @{value.input_partition}:"
                f"{value.input_offset} head {value.history_before[:8]}→{value.history_after[:8]}"
                f" v{value.thread_version} {value.provenance}",
            )

    def _input(self, record: Input) -> None:
        body = record.body
        thread = record.thread_id
        match body:
            case CreateThread(config=config):
                parent = config.parent
                if parent is None:
                    self.names.setdefault(thread, thread)
                    self._line(thread, "create", f"root thread, model {config.model}")
                else:
                    key = (parent.parent_thread_id, parent.kind)
                    self._counts[key] = self._counts.get(key, 0) + 1
                    self.names[thread] = (
                        f"{self.name(parent.parent_thread_id)}/{parent.kind}-{self._counts[key]}"
                    )
                    self._line(
                        thread,
                        "create",
                        f"{parent.kind} of {self.name(parent.parent_thread_id)}, "
                        f"inherits {len(body.inherited)} entries",
                    )
            case UserMessage(content=content):
                self._line(thread, "user", _text(content))
            case Completion(error=error) if error is not None:
                self._line(
                    thread, "model", f"ERROR {error.kind} after {error.attempts} attempts: {error.message}"
                )
            case Completion(content=content, tool_calls=calls):
                said = _text(content)
                called = ", ".join(f"{c.name}({short(c.arguments, 50)})" for c in calls)
                self._line(
                    thread, "model", " | ".join(p for p in (said, f"calls {called}" if called else "") if p)
                )
            case ToolResult(ok=ok, content=content, subscription=subscription):
                tag = "subscribed" if subscription else ("ok" if ok else "error")
                self._line(thread, "result", f"{tag}: {_text(content)}")
            case ToolEvent(sequence=seq, associative=associative, final=final, content=content):
                how = "associative" if associative else "threaded"
                self._line(thread, "tool-event", f"#{seq} {how}{' final' if final else ''}: {_text(content)}")
            case ChildReport(child_thread_id=child, kind=kind, text=text):
                self._line(thread, "report", f"from {self.name(child)} ({kind}): {text or ''}")
            case ParentMessage(text=text):
                self._line(thread, "parent-msg", text)
            case TimerFired(due_at=due_at):
                self._line(thread, "timer", f"fired (due {due_at})")
            case ApprovalRequest(prompt=prompt, choices=choices):
                self._line(thread, "approval?", f"{prompt} {list(choices)}")
            case ApprovalDecision(choice=choice, decided_by=who):
                self._line(thread, "decision", f"{choice} by {who}")
            case Control(command=command, reason=reason):
                self._line(thread, "control", f"{command}{f' ({reason})' if reason else ''}")

    def _event(self, event: ThreadEvent) -> None:
        if event.ephemeral and not self.deltas and event.kind == "delta":
            return
        detail = with_data(event.text or "", json.loads(event.data) if event.data else None)
        self._line(event.thread_id, f"· {event.kind}", short(detail, 80))

    def _line(self, thread_id: str, kind: str, text: str) -> None:
        now = self.clock()
        if self._start is None:
            self._start = now
        line = f"+{(now - self._start) / 1000:6.3f}s  {self.name(thread_id):<22} {kind:<22} {short(text)}"
        self.lines.append(line)
        if self.emit is not None:
            self.emit(line)
