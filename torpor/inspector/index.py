"""The threads list of `torpor ui`: every thread seen on `events` and `receipts`, summarised.

Contract. `ThreadIndex.observe(item)` folds one record (a `ThreadEvent` or a `Receipt`,
as `Observer.read` yields them) into the thread's `ThreadSummary`; `query(...)` answers
one page of the list, filtered and ordered on the server, so a browser never holds more
than a page however many threads there are. The index is rebuilt from the topics at
start (they are the source of truth; `events` keeps a day by default), so it holds no
state of its own worth saving.

What a summary says is what the committed events said, in order: the status is the one
the last status-changing event implies (`thread_created` idle, `completion_requested`
awaiting_model, `tool_dispatched` awaiting_tools, `stopped`, `parked`, `closed`, ...),
the model the last `completion_requested` or `model_set` named, the tenant the last
receipt's authority snapshot granted. Pending calls are those dispatched and not yet
answered; pending approvals those requested and not yet decided or dismissed.

Thread safety: one writer (the feed's thread) calls `observe`; readers call `query` and
`summary` from the server's event loop. A lock keeps them apart; each answer is a copy.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field, replace
from typing import Final

from torpor.schemas.records import Receipt, ThreadEvent, ToolResultEntry

MAX_LIMIT: Final = 200
"""The largest page a client may ask for: a page is what a person reads, not an export."""

# event kind -> the status it leaves the thread in (kinds not listed change no status).
_STATUS_OF: Final[dict[str, str]] = {
    "thread_created": "idle",
    "completion_requested": "awaiting_model",
    "turn_committed": "idle",
    "tool_dispatched": "awaiting_tools",
    "stopped": "stopped",
    "parked": "parked",
    "closed": "closed",
    "deleted": "deleted",
    "resumed": "idle",
    "unparked": "idle",
}
# Statuses a later ordinary event does not undo (only `resumed` / `unparked` do).
_STICKY: Final = frozenset({"stopped", "parked", "closed", "deleted"})


@dataclass(frozen=True, slots=True)
class PendingApproval:
    approval_id: str
    call_id: str
    prompt: str
    choices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    """One row of the threads list."""

    thread_id: str
    status: str = "unknown"
    reason: str | None = None
    model: str | None = None
    tenant: str | None = None
    parent: str | None = None
    children: tuple[str, ...] = ()
    created_at: int | None = None
    last_activity: int = 0
    events: int = 0
    receipts: int = 0
    pending_calls: tuple[str, ...] = ()
    approvals: tuple[PendingApproval, ...] = ()

    def as_json(self) -> dict[str, object]:
        return {
            "thread_id": self.thread_id, "status": self.status, "reason": self.reason, "model": self.model,
            "tenant": self.tenant, "parent": self.parent, "children": list(self.children),
            "created_at": self.created_at, "last_activity": self.last_activity, "events": self.events,
            "receipts": self.receipts, "pending_calls": list(self.pending_calls),
            "approvals": [{"approval_id": a.approval_id, "call_id": a.call_id, "prompt": a.prompt,
                           "choices": list(a.choices)} for a in self.approvals],
        }


@dataclass(frozen=True, slots=True)
class Page:
    """One page of the list: `rows` from `offset`, of `total` threads that match."""

    rows: tuple[ThreadSummary, ...]
    offset: int
    total: int

    def as_json(self) -> dict[str, object]:
        return {"rows": [r.as_json() for r in self.rows], "offset": self.offset, "total": self.total}


@dataclass(slots=True)
class ThreadIndex:
    """Every thread's summary, folded from observed records; see the module docstring."""

    _threads: dict[str, ThreadSummary] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    version: int = 0
    """Incremented by every record that changed a summary: how a watcher knows to look again."""

    def observe(self, record: ThreadEvent | Receipt) -> None:
        with self._lock:
            before = self._threads.get(record.thread_id) or ThreadSummary(record.thread_id)
            after = _on_receipt(before, record) if isinstance(record, Receipt) else _on_event(before, record)
            if after is before:
                return
            self._threads[record.thread_id] = after
            parent = after.parent
            if parent is not None and before.parent != parent:
                known = self._threads.get(parent) or ThreadSummary(parent)
                if record.thread_id not in known.children:
                    self._threads[parent] = replace(known, children=(*known.children, record.thread_id))
            self.version += 1

    def summary(self, thread_id: str) -> ThreadSummary | None:
        with self._lock:
            return self._threads.get(thread_id)

    def __len__(self) -> int:
        return len(self._threads)

    def query(self, text: str = "", status: str = "", offset: int = 0, limit: int = 50) -> Page:
        """The threads whose id, model, tenant or parent contains `text` (case-insensitive) and
        whose status is `status` (if given), newest activity first, `limit` from `offset`.

        Raises ValueError for a negative offset or a limit outside 1..MAX_LIMIT.
        """
        if offset < 0 or not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"offset must be >= 0 and limit within 1..{MAX_LIMIT}")
        needle = text.casefold()
        with self._lock:
            rows = list(self._threads.values())
        matching = [r for r in rows
                    if (not status or r.status == status) and (not needle or _matches(r, needle))]
        matching.sort(key=lambda r: (-r.last_activity, r.thread_id))
        return Page(tuple(matching[offset: offset + limit]), offset, len(matching))


def _matches(row: ThreadSummary, needle: str) -> bool:
    return any(needle in value.casefold() for value in (row.thread_id, row.model, row.tenant, row.parent)
               if value)


def _data(event: ThreadEvent) -> dict[str, object]:
    if not event.data:
        return {}
    try:
        data = json.loads(event.data)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _on_event(row: ThreadSummary, event: ThreadEvent) -> ThreadSummary:
    if event.ephemeral:  # live deltas: activity, not state; a summary is not rewritten per token
        return row
    data = _data(event)
    changes: dict[str, object] = {"events": row.events + 1, "last_activity": max(row.last_activity,
                                                                                  event.created_at)}
    status = _STATUS_OF.get(event.kind)
    if status is not None and (row.status not in _STICKY or event.kind in ("resumed", "unparked")
                               or status in _STICKY):
        changes["status"] = status
        changes["reason"] = event.text if status in _STICKY else None
    kind = event.kind
    if kind == "thread_created":
        changes["created_at"] = event.created_at
        if isinstance(parent := data.get("parent"), str):
            changes["parent"] = parent
    elif kind in ("completion_requested", "model_set") and isinstance(model := data.get("model"), str):
        changes["model"] = model
    elif kind == "tool_dispatched" and isinstance(call := data.get("call_id"), str):
        changes["pending_calls"] = (*row.pending_calls, call)
    elif kind in ("tool_result", "interrupted"):
        answered = (event.entry.body.call_id if event.entry is not None
                    and isinstance(event.entry.body, ToolResultEntry) else data.get("call_id"))
        changes["pending_calls"] = tuple(c for c in row.pending_calls if c != answered)
    elif kind == "child_spawned" and isinstance(child := data.get("child_thread_id"), str):
        if child not in row.children:
            changes["children"] = (*row.children, child)
    elif kind == "approval_requested" and isinstance(approval := data.get("approval_id"), str):
        choices = data.get("choices")
        changes["approvals"] = (*row.approvals, PendingApproval(
            approval, str(data.get("call_id", "")), event.text or "",
            tuple(str(c) for c in choices) if isinstance(choices, list) else ()))
    elif kind == "approval_decided":
        changes["approvals"] = tuple(a for a in row.approvals if a.approval_id != data.get("approval_id"))
    elif kind == "approval_dismissed":
        changes["approvals"] = tuple(a for a in row.approvals if a.call_id != data.get("call_id"))
    if status in ("stopped", "closed", "deleted"):
        changes["pending_calls"] = ()
        changes["approvals"] = ()
    return replace(row, **changes)  # type: ignore[arg-type]


def _on_receipt(row: ThreadSummary, receipt: Receipt) -> ThreadSummary:
    tenant = receipt.authority_snapshot.tenant if receipt.authority_snapshot is not None else row.tenant
    return replace(row, receipts=row.receipts + 1, tenant=tenant,
                   last_activity=max(row.last_activity, receipt.created_at))
