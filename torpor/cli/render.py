"""How `torpor tail` renders events and receipts: one line per record, the threads as a tree.

Output contract: `HH:MM:SS.mmm  <thread>  <kind>  <text>` with the record's own time
(UTC), so the same record renders to the same line in every run and a resumed tail
continues a transcript exactly. Children are named `<parent>/<kind>:<id>` (the first 6
hex digits of the child's id: stable whatever order the partitions are read in) and
indented by depth. The renderer's state (the followed tree and the names) is plain JSON,
saved with the resume position, so a reattached tail names threads as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

from torpor.cli.transcript import printable, short, with_data
from torpor.schemas.records import (
    AssistantEntry,
    ContentBlock,
    EventEntry,
    HistoryEntry,
    ImageBlock,
    Receipt,
    SummaryEntry,
    TextBlock,
    ThinkingBlock,
    ThreadEvent,
    ToolResultEntry,
    UserEntry,
)
from torpor.streams.observer import Item, Observed

WIDTH = 110
APPROVAL = "approval?"
MAX_NAMES = 10_000
# Events whose entry says it all: the kind column names the entry, not the event.
_ENTRY_KINDS = {
    UserEntry: "user",
    AssistantEntry: "model",
    ToolResultEntry: "result",
    EventEntry: "event",
    SummaryEntry: "summary",
}


def _blocks(blocks: tuple[ContentBlock, ...] | tuple[TextBlock | ThinkingBlock, ...]) -> str:
    parts = []
    for block in blocks:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            parts.append("[thinking]")
        elif isinstance(block, ImageBlock):
            parts.append(f"[image {block.media_type}]")
    return " ".join(parts)


def entry_text(entry: HistoryEntry) -> str:
    body = entry.body
    match body:
        case UserEntry(content=content, interrupt=interrupt):
            return f"{'(interrupts) ' if interrupt else ''}{_blocks(content)}"
        case AssistantEntry(content=content, tool_calls=calls):
            said = _blocks(content)
            called = ", ".join(f"{c.name}({short(c.arguments, 50)})" for c in calls)
            return " | ".join(p for p in (said, f"calls {called}" if called else "") if p)
        case ToolResultEntry(name=name, ok=ok, content=content, origin=origin):
            how = "ok" if ok else "error"
            return f"{name} {how}{'' if origin == 'tool' else f' ({origin})'}: {_blocks(content)}"
        case EventEntry(kind=kind, original_tool_name=tool, content=content):
            return f"{kind} from {tool}: {_blocks(content)}"
        case SummaryEntry(text=text, up_to_seq=up_to):
            return f"summary of entries < {up_to}: {text}"
    return ""


@dataclass(slots=True)
class Renderer:
    """Turns observed records into lines; `root` limits them to one thread and its descendants."""

    root: str | None = None
    deltas: bool = True
    names: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.root is not None:
            self.names.setdefault(self.root, self.root)

    def follows(self, thread_id: str) -> bool:
        return self.root is None or thread_id in self.names

    def name(self, thread_id: str) -> str:
        return self.names.get(thread_id, thread_id)

    def render(self, item: Item) -> str | None:
        """The line for `item`, or None when it is not shown (another thread, a hidden delta)."""
        if not isinstance(item, Observed):
            where = f"{item.topic}[{item.partition}]@{item.offset}"
            return f"{'':12}  {'!':<28} {'undecodable':<16} {where}: {item.reason}"
        record = item.record
        if isinstance(record, Receipt):
            if not self.follows(record.thread_id):
                return None
            return self._line(record.thread_id, record.created_at, "receipt", _receipt(record))
        data = json.loads(record.data) if record.data else None
        self._learn(record, data)
        if not self.follows(record.thread_id):
            return None
        if record.ephemeral and record.kind == "delta":
            return (
                self._line(record.thread_id, record.created_at, "model…", record.text or "")
                if self.deltas
                else None
            )
        return self._line(record.thread_id, record.created_at, *_event(record, data))

    def _learn(self, event: ThreadEvent, data: object) -> None:
        """Name (and so follow) a child as soon as its parent's spawn or its own creation is seen."""
        if not isinstance(data, dict):
            return
        if event.kind == "child_spawned" and isinstance(child := data.get("child_thread_id"), str):
            self._adopt(event.thread_id, child, str(data.get("kind", "child")))
        elif event.kind == "thread_created" and isinstance(parent := data.get("parent"), str):
            self._adopt(parent, event.thread_id, "child")

    def _adopt(self, parent: str, child: str, kind: str) -> None:
        if child in self.names or not self.follows(parent):
            return
        if self.root is None and len(self.names) >= MAX_NAMES:
            # Every thread's tail keeps the newest names only (the oldest falls back to its id),
            # so its state stays small however long it runs. A thread's own tree is not cut.
            del self.names[next(iter(self.names))]
        self.names[child] = f"{self.name(parent)}/{kind}:{child.removeprefix('tp_')[:6]}"

    def _line(self, thread_id: str, created_at: int, kind: str, text: str) -> str:
        name = printable(self.name(thread_id))  # a thread id is the writer's text too
        indent = "  " * name.count("/")
        when = datetime.fromtimestamp(created_at / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]
        # An approval's line ends in the command that decides it: never cut, so it can be copied.
        shown = short(text, 10_000 if kind == APPROVAL else WIDTH)
        return f"{when}  {indent}{name:<{max(28 - len(indent), 8)}} {kind:<16} {shown}"

    def state(self) -> dict[str, object]:
        return {"root": self.root, "names": dict(self.names)}

    @classmethod
    def from_state(cls, state: dict[str, object], *, deltas: bool) -> Renderer:
        names = state.get("names")
        root = state.get("root")
        if not isinstance(names, dict) or not (root is None or isinstance(root, str)):
            raise ValueError("the renderer state has no names map")
        return cls(root=root, deltas=deltas, names={str(k): str(v) for k, v in names.items()})


def _event(event: ThreadEvent, data: object) -> tuple[str, str]:
    if event.entry is not None and event.kind != "approval_requested":
        kind = _ENTRY_KINDS.get(type(event.entry.body), event.kind)
        return kind, f"#{event.entry.seq} {entry_text(event.entry)}"
    if event.kind == "approval_requested" and isinstance(data, dict):
        choices = "|".join(str(c) for c in data.get("choices", []))
        return APPROVAL, (
            f"{event.text or ''} -> torpor approve {data.get('approval_id')} {{{choices}}} "
            f"--thread {event.thread_id}"
        )
    detail = event.text or ""
    if data is not None and not isinstance(data, dict):
        return event.kind, " ".join(p for p in (detail, json.dumps(data)) if p)
    return event.kind, with_data(detail, data)


def _receipt(receipt: Receipt) -> str:
    reason = f" ({receipt.reason})" if receipt.reason else ""
    where = (
        f" @{receipt.input_partition}:{receipt.input_offset}" if receipt.input_partition is not None else ""
    )
    return (
        f"{receipt.disposition}{reason} input={receipt.input_id[:14]}{where} v{receipt.thread_version} "
        f"{receipt.provenance}"
    )
