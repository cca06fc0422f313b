"""The fold's values: a thread's state and the small records it holds.

(`Facts`, what the shell looked up, live in `facts.py`; the `Transition` in `effects.py`:
both compiled, torpor.native. These stay Python classes: the state codec reads their
fields' declared types, which a compiled class does not keep.)

`ThreadState` is the one small record the processor keeps per thread (besides its
history rows). It is a frozen value: `fold` never mutates it, it returns a new one
inside a `Transition`. Every field is a primitive, a tuple, a wire record from
`torpor.schemas.records`, or one of the small frozen records below, so the shell can
serialise it deterministically. Only `torpor.processors.fold.transitions` assigns `status`.

Field contract for the shell (store, local mode, model stage):
- `history_len` and `head` describe the stored history: entries `0 .. history_len-1`,
  and the hash-chain head after the last of them (hex sha256; `GENESIS_HEAD` if none).
- `pending_request` is the id of the completion in flight (status `awaiting_model`); the
  model stage re-issues it after a restart, over the first `pending_request_len` entries.
- `model` is the model to use for the next completion (`Control set_model` changes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from torpor.schemas.frozen import fast_inits
from torpor.schemas.records import Input, ThreadConfig

GENESIS_HEAD: Final = "0" * 64
"""The hash-chain head of an empty history (32 zero bytes, hex)."""


class Status(StrEnum):
    """A thread's status, spelled as on the wire. See the diagram in `fold.py`."""

    IDLE = "idle"
    AWAITING_MODEL = "awaiting_model"
    AWAITING_TOOLS = "awaiting_tools"
    CLOSED = "closed"
    STOPPED = "stopped"
    PARKED = "parked"


class CallKind(StrEnum):
    """What kind of work a pending call is waiting for."""

    TOOL = "tool"  # dispatched to a connector, answered by a ToolResult
    TIMER = "timer"  # sleep / sleep_until, dispatched to the timer connector, answered by TimerFired
    WAIT = "wait"  # sleep_until_event_or_input: nothing dispatched, ended by any event or input


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A committed tool call still waiting for its one result.

    `request_id` is the dispatch's idempotency key (empty for `WAIT` calls, which
    dispatch nothing); a result must carry it to count. `passive` calls (the sleeps)
    represent waiting: events are not deferred behind them, they end them instead.
    """

    call_id: str
    tool: str
    arguments: str
    passive: bool
    kind: CallKind
    request_id: str
    dispatched_at: int
    attempts: int


@dataclass(frozen=True, slots=True)
class Subscription:
    """A live subscription started by call `call_id` (a ToolResult with subscription=true).

    `last_sequence` is the highest event sequence accepted so far (-1 before the first):
    a repeated or older sequence is a duplicate.
    """

    call_id: str
    tool: str
    arguments: str
    request_id: str
    last_sequence: int


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A connector's question to a person about pending call `call_id`."""

    approval_id: str
    call_id: str
    request_id: str
    tool: str
    choices: tuple[str, ...]
    expires_at: int | None


@dataclass(frozen=True, slots=True)
class ChildRef:
    """A live child thread: spawned by call `spawn_call_id`, of ParentLink kind `kind`.

    `tool`/`arguments` are the original call the child is about (for an `event` child:
    the subscription call), so its reports can be injected bound to that call.
    """

    thread_id: str
    spawn_call_id: str
    kind: str
    tool: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Compaction:
    """A compaction in flight: child `child_thread_id` summarises entries `< up_to_seq`."""

    child_thread_id: str
    up_to_seq: int


@dataclass(frozen=True, slots=True)
class ThreadState:
    """Everything the fold knows about one thread (its history rows aside)."""

    thread_id: str
    status: Status
    version: int
    config: ThreadConfig
    model: str
    history_len: int
    head: str
    pending_request: str | None
    pending_request_len: int
    pending_calls: tuple[PendingCall, ...]
    # The seq of the AssistantEntry whose calls are pending: the safe point before it.
    pending_turn_seq: int | None
    answered_calls: tuple[str, ...]
    subscriptions: tuple[Subscription, ...]
    deferred: tuple[Input, ...]
    approvals: tuple[PendingApproval, ...]
    children: tuple[ChildRef, ...]
    compaction: Compaction | None
    # True when history holds input the model has not answered yet.
    owes_turn: bool
    turns: int
    invalid_rounds: int
    last_total_tokens: int
    park_reason: str | None
    stop_reason: str | None
    # A child's own spawn call arguments (to refuse a confused re-spawn), and whether it
    # has already sent its one terminal report to its parent.
    spawn_arguments: str | None
    terminal_reported: bool


ANSWERED_KEPT: Final = 256
"""How many answered call ids a thread remembers (the newest): a later copy of a result
for one of them is a `duplicate`, for an older one `stale`. Both are absorbed; only the
label differs, and the state row stays bounded however long the thread lives."""


def with_answered(answered: tuple[str, ...], call_id: str) -> tuple[str, ...]:
    """`answered` with `call_id` added, the oldest dropped past `ANSWERED_KEPT`."""
    return (*answered[-(ANSWERED_KEPT - 1):], call_id)


# Records are built several times per input: a faster __init__, same signature (frozen.py).
fast_inits(__name__)
