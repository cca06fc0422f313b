"""What the fold decides, as data: a closed union of effects, and the `Transition`.

`fold(state, input, facts)` returns a `Transition`: the thread's new state and an ordered
tuple of effects that ends with exactly one `EmitReceipt`. Only the shell (the `step`
entry point, shared by local mode and the Kafka processor) interprets effects, with a
`match` closed by `assert_never`, turning each into store writes and records of the
open transaction:

- `AppendHistory`      a history row (and a changelog record) for this thread
- `DispatchTool`       a record on the `outbox`, visible to connectors after the commit
- `Loopback`           an input for another thread (or this one), produced to `inputs`
- `SpawnChild`         a `CreateThread` loopback whose inherited history the shell reads
                       from this thread's committed rows (the fold never reads the store)
- `ForkThread`         the same for a fork: a root thread inheriting entries `0..at_seq` whole
- `RequestCompletion`  work for the model stage, run only after the commit
- `EmitEvent`          a record on the `events` topic
- `RememberInput`      mark a message id as seen, so a redelivery is a duplicate
- `EmitReceipt`        the one receipt of the input, on the `receipts` topic

The effects built at every input (about eleven per completion) write their own `__init__`
of plain attribute stores (`init=False`). This module is compiled (torpor.native): there the
stores go straight to a native class's slots, which the frozen `__setattr__` does not see,
and an effect is built in ~0.03 us; the `__init__` that `dataclasses` generates is Python
even in a compiled module (~0.7 us). Run as Python, the same stores would meet the frozen
`__setattr__` and raise: there `fast_inits` (end of the module) replaces each such
`__init__` with its slot-setting one of the same signature, so that body never runs. To
every caller the class is frozen either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from torpor.processors.fold.state import ThreadState
from torpor.schemas.frozen import fast_inits
from torpor.schemas.records import (
    ContentBlock,
    Dispatch,
    ForkOrigin,
    HistoryEntry,
    Input,
    Receipt,
    ThreadConfig,
    ThreadEvent,
)


@dataclass(frozen=True, slots=True, init=False)
class AppendHistory:
    """Append `entry` to the thread's history (its `seq` is the next free one).

    `canonical`: the entry's `canonical_bytes`, the bytes its hash-chain link covers;
    the shell frames these same bytes as the history row instead of encoding it again.
    """

    entry: HistoryEntry
    canonical: bytes

    def __init__(self, entry: HistoryEntry, canonical: bytes) -> None:  # compiled only: module docstring
        self.entry = entry  # type: ignore[misc]
        self.canonical = canonical  # type: ignore[misc]


@dataclass(frozen=True, slots=True, init=False)
class DispatchTool:
    """Send `dispatch` to the outbox in the same transaction as the turn that made it."""

    dispatch: Dispatch

    def __init__(self, dispatch: Dispatch) -> None:  # compiled only: module docstring
        self.dispatch = dispatch  # type: ignore[misc]


@dataclass(frozen=True, slots=True, init=False)
class Loopback:
    """Produce `input` to the `inputs` topic, keyed (and partitioned) by its thread id."""

    input: Input

    def __init__(self, input: Input) -> None:  # compiled only: module docstring
        self.input = input  # type: ignore[misc]


@dataclass(frozen=True, slots=True)
class SpawnChild:
    """Create a child thread that inherits this thread's history `[from_seq, up_to_seq)`.

    The shell reads those entries (model-visible ones: from the latest summary on) and
    produces `Input(message_id, child_thread_id, created_at, "processor", body=
    CreateThread(config, inherited=<entries>, initial=initial))`. The child's own
    replay then depends only on that input's bytes.
    """

    message_id: str
    child_thread_id: str
    created_at: int
    config: ThreadConfig
    from_seq: int
    up_to_seq: int
    initial: tuple[ContentBlock, ...]


@dataclass(frozen=True, slots=True)
class ForkThread:
    """Create root thread `new_thread_id` whose history is this thread's entries `0..origin.at_seq`.

    The shell reads those entries from this thread's committed rows, all of them and
    unchanged (not the model-visible cut a child gets, and never fewer: if they do not fit
    one input the fork is refused whole), and produces `Input(message_id, new_thread_id,
    created_at, "processor", body=CreateThread(config, inherited=<entries>, initial=(),
    fork=origin))`. The fork's own replay then depends only on that input's bytes.
    """

    message_id: str
    new_thread_id: str
    created_at: int
    config: ThreadConfig
    origin: ForkOrigin


@dataclass(frozen=True, slots=True, init=False)
class RequestCompletion:
    """Ask the model stage for one completion of `thread_id` over its first `history_len` entries.

    The result comes back as a `Completion` input whose message id is `request_id`.
    """

    request_id: str
    thread_id: str
    model: str
    history_len: int
    created_at: int

    def __init__(self, request_id: str, thread_id: str, model: str, history_len: int,
                 created_at: int) -> None:  # compiled only: module docstring
        self.request_id = request_id  # type: ignore[misc]
        self.thread_id = thread_id  # type: ignore[misc]
        self.model = model  # type: ignore[misc]
        self.history_len = history_len  # type: ignore[misc]
        self.created_at = created_at  # type: ignore[misc]


@dataclass(frozen=True, slots=True, init=False)
class EmitEvent:
    """Publish `event` on the `events` topic."""

    event: ThreadEvent

    def __init__(self, event: ThreadEvent) -> None:  # compiled only: module docstring
        self.event = event  # type: ignore[misc]


@dataclass(frozen=True, slots=True, init=False)
class RememberInput:
    """Record `message_id` as seen for this thread: a later copy is a duplicate."""

    message_id: str

    def __init__(self, message_id: str) -> None:  # compiled only: module docstring
        self.message_id = message_id  # type: ignore[misc]


@dataclass(frozen=True, slots=True, init=False)
class EmitReceipt:
    """The input's one receipt. Always the last effect of a `Transition`."""

    receipt: Receipt

    def __init__(self, receipt: Receipt) -> None:  # compiled only: module docstring
        self.receipt = receipt  # type: ignore[misc]


Effect = (
    AppendHistory
    | DispatchTool
    | Loopback
    | SpawnChild
    | ForkThread
    | RequestCompletion
    | EmitEvent
    | RememberInput
    | EmitReceipt
)


@dataclass(frozen=True, slots=True, init=False)
class Transition:
    """The fold's answer: the new state (None: the thread does not exist or was deleted)
    and the ordered effects, ending with exactly one `EmitReceipt`."""

    state: ThreadState | None
    effects: tuple[Effect, ...]

    def __init__(self, state: ThreadState | None, effects: tuple[Effect, ...]) -> None:  # compiled only
        self.state = state  # type: ignore[misc]
        self.effects = effects  # type: ignore[misc]


# Records are built several times per input: a faster __init__, same signature (frozen.py).
# In the pure build this also replaces each `__init__` written for the compiled one (docstring).
fast_inits(__name__)
