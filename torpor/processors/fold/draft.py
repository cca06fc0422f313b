"""The transition being drafted while one input is folded (local to one `fold` call).

A `Draft` collects the new state and the ordered effects for one input. It is mutable
only inside a single `fold` call and never escapes it, so the fold stays a pure
function: same state, input and facts in, same transition out. It builds effects and
history entries (advancing the hash chain) but never assigns `ThreadState.status`:
that is `fold.py`'s alone.

The state. `Draft.state` is the draft's own copy of the input state, made once when the
draft is created and changed in place by `replace` (about eight changes per input; a
`dataclasses.replace` of the 25-field `ThreadState` for each cost most of the fold). The
caller's state is never touched, and the copy is handed out only as the finished
`Transition.state`, after which nobody changes it: outside one `fold` call every
`ThreadState` is as frozen as its class says. Inside, a local `state = draft.state` is the
same object: a field read after a `replace` shows the new value, so read what you need
before you change it.

Ids: every id minted here derives from the message id of the input being folded
(`current`, which differs from `origin` only while a deferred input is released) plus a
label and a counter, so a replay mints the same ids.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from torpor.processors.fold.effects import (
    AppendHistory,
    DispatchTool,
    Effect,
    EmitEvent,
    ForkThread,
    Loopback,
    RequestCompletion,
    SpawnChild,
)
from torpor.processors.fold.facts import Facts
from torpor.processors.fold.history import advance_bytes
from torpor.processors.fold.state import ThreadState
from torpor.schemas.codec import canonical_bytes
from torpor.schemas.ids import derive_id, fork_creation_id
from torpor.schemas.records import (
    ContentBlock,
    Dispatch,
    ForkOrigin,
    HistoryBody,
    HistoryEntry,
    Input,
    InputBody,
    TextBlock,
    ThreadConfig,
    ThreadEvent,
)
from torpor.schemas.sortedjson import sorted_json

PROCESSOR_SOURCE = "processor"


_STATE_FIELDS: Final = tuple(f.name for f in dataclasses.fields(ThreadState))


def _own_copy(state: ThreadState) -> ThreadState:
    """A field-for-field copy of `state` for one draft to change in place (module docstring).

    Fields are set with `object.__setattr__`, which steps around the frozen class's own
    `__setattr__`; compiled (torpor.native), that call is one C call to the generic setter,
    cheaper than a slot's `__set__` through the interpreter's call machinery. (Run as
    Python it is the slower of the two: the compiled core is what is measured.)"""
    copy: ThreadState = object.__new__(ThreadState)
    for name in _STATE_FIELDS:
        object.__setattr__(copy, name, getattr(state, name))
    return copy


# One encoder for every call: json.dumps with options builds a new one each time.
_json_text: Final = sorted_json(ensure_ascii=True)


def json_text(value: object) -> str:
    """Deterministic JSON text (sorted keys, no spaces) for dispatch arguments and event data."""
    return _json_text(value)


def _event(event_id: str, thread_id: str, created_at: int, kind: str, entry: HistoryEntry | None,
           text: str | None, data: str | None) -> ThreadEvent:
    """A fold's event (not ephemeral), every field set without `ThreadEvent.__init__`, as
    `receipts.build_receipt` builds a receipt and for its reason: several per input.

    A function of the module, not a method: inside a method of a compiled class, mypyc
    turns `object.__setattr__(x, "name", v)` into a store into that class's own attribute
    `name` when it has one, whatever `x` is."""
    event: ThreadEvent = object.__new__(ThreadEvent)
    object.__setattr__(event, "event_id", event_id)
    object.__setattr__(event, "thread_id", thread_id)
    object.__setattr__(event, "created_at", created_at)
    object.__setattr__(event, "kind", kind)
    object.__setattr__(event, "ephemeral", False)
    object.__setattr__(event, "seq", entry.seq if entry is not None else None)
    object.__setattr__(event, "entry", entry)
    object.__setattr__(event, "text", text)
    object.__setattr__(event, "data", data)
    return event


def text(value: str) -> tuple[ContentBlock, ...]:
    return (TextBlock(value),)


class Draft:
    """One input's transition in the making. See the module docstring.

    A plain class with its own `__init__`, not a dataclass: compiled (torpor.native), it is
    a native class built without the interpreter (a dataclass's `__init__` is generated
    Python even there: ~2 us per input folded, against ~0.1 us)."""

    __slots__ = ("_counter", "_touched", "close_report", "closing", "current", "deleted", "effects", "facts",
                 "origin", "reason", "released", "state", "tool_request_ids", "turn_commit")

    def __init__(self, state: ThreadState, origin: Input, facts: Facts, current: Input) -> None:
        self.state: ThreadState = _own_copy(state)  # the draft's own copy: the caller's is never touched
        self.origin = origin
        self.facts = facts
        self.current = current
        self.effects: list[Effect] = []
        self.tool_request_ids: list[str] = []
        self.turn_commit = False
        self.released = False
        self.deleted = False
        self.reason: str | None = None
        self.close_report: str | None = None  # set by a valid close_thread call; fold.py closes
        self.closing = False  # a close_thread call of this turn was valid: the first one wins
        self._counter = 0
        self._touched: set[str] = set()  # the fields `replace` assigned

    @property
    def now(self) -> int:
        return self.current.created_at

    def new_id(self, *parts: str) -> str:
        """A fresh id for this transition, derived from the current input's message id."""
        self._counter += 1
        return derive_id(self.current.message_id, *parts, str(self._counter))

    def stable_id(self, *parts: str) -> str:
        """An id derived from the current input and `parts` only (no counter)."""
        return derive_id(self.current.message_id, *parts)

    def replace(self, **changes: object) -> ThreadState:
        """Change fields of the draft's own state in place (module docstring); return it."""
        state = self.state
        for name, value in changes.items():
            object.__setattr__(state, name, value)  # frozen to everyone else: `_own_copy` says why
        self._touched.update(changes)
        return state

    def is_changed_from(self, before: ThreadState) -> bool:
        """Whether the draft's state differs from `before` (the state it was drafted from):
        what `!=` on the two would say, comparing only the fields `replace` assigned."""
        state = self.state
        for name in self._touched:
            old, new = getattr(before, name), getattr(state, name)
            if old is not new and old != new:
                return True
        return False

    # --- history ----------------------------------------------------------------------

    def append(self, body: HistoryBody, input_id: str | None = None,
               created_at: int | None = None) -> HistoryEntry:
        """Append one history entry, advancing the hash chain (not narrated: callers emit).

        `input_id` and `created_at` default to the current input's; a fork passes the
        source entry's own, so its chain repeats the source's."""
        when = self.now if created_at is None else created_at
        # By position (seq, created_at, input_id, body), as `emit` builds an event.
        entry = HistoryEntry(self.state.history_len, when, input_id or self.current.message_id, body)
        canonical = canonical_bytes(entry)  # encoded once: the chain and the row share the bytes
        self.replace(history_len=self.state.history_len + 1, head=advance_bytes(self.state.head, canonical))
        self.effects.append(AppendHistory(entry, canonical))
        return entry

    # --- effects ----------------------------------------------------------------------

    def emit(self, kind: str, entry: HistoryEntry | None = None, detail: str | None = None,
             data: object = None) -> None:
        event = _event(self.new_id("event", kind), self.state.thread_id, self.now, kind, entry, detail,
                       json_text(data) if data is not None else None)
        self.effects.append(EmitEvent(event))

    def dispatch(self, call_id: str, tool: str, arguments: str, kind: str, request_id: str,
                 deadline: int | None = None) -> Dispatch:
        record = Dispatch(request_id=request_id, thread_id=self.state.thread_id, call_id=call_id,
                          tool=tool, arguments=arguments, capability=self.state.config.capability,
                          attempt=self.facts.attempt, created_at=self.now, deadline=deadline, kind=kind)
        self.effects.append(DispatchTool(record))
        self.tool_request_ids.append(request_id)
        return record

    def cancel(self, call_id: str, tool: str) -> None:
        """Dispatch a best-effort `cancel` of call `call_id` to `tool`'s connector."""
        self.dispatch(call_id, tool, "{}", "cancel", self.stable_id("cancel", call_id))

    def loopback(self, thread_id: str, body: InputBody, *label: str) -> None:
        """Send `body` to thread `thread_id` through the inputs topic (children and parents)."""
        record = Input(message_id=self.stable_id("loopback", thread_id, *label), thread_id=thread_id,
                       created_at=self.now, source=PROCESSOR_SOURCE, expires_at=None, key_id=None,
                       signature=None, body=body)
        self.effects.append(Loopback(record))

    def spawn(self, child_thread_id: str, config: ThreadConfig, up_to_seq: int,
              initial: tuple[ContentBlock, ...]) -> None:
        self.effects.append(SpawnChild(message_id=self.stable_id("spawn", child_thread_id),
                                       child_thread_id=child_thread_id, created_at=self.now,
                                       config=config, from_seq=0, up_to_seq=up_to_seq, initial=initial))

    def fork(self, new_thread_id: str, config: ThreadConfig, origin: ForkOrigin) -> None:
        """Ask the shell to create fork `new_thread_id` of this thread (`forks.py`)."""
        self.effects.append(ForkThread(message_id=fork_creation_id(self.current.message_id, new_thread_id),
                                       new_thread_id=new_thread_id, created_at=self.now, config=config,
                                       origin=origin))

    def request_completion(self) -> str:
        request_id = self.new_id("completion")
        self.replace(pending_request=request_id, pending_request_len=self.state.history_len)
        self.effects.append(RequestCompletion(request_id=request_id, thread_id=self.state.thread_id,
                                              model=self.state.model, history_len=self.state.history_len,
                                              created_at=self.now))
        self.emit("completion_requested", data={"request_id": request_id, "model": self.state.model})
        return request_id
