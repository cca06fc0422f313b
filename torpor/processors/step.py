"""`step`: the fold's batch entry point, shared by local mode and the Kafka processor.

Contract. `step(store, records)` folds `records` (inputs of one partition, in offset
order) one at a time and returns a `StepOutput`: everything the checkpoint must write.
For each record it

0. checks it at the door (`door_problem`): its thread and message ids keep the wire
   rule (`torpor.schemas.ids`), its record key is its thread id's bytes, and it sits on
   its thread's partition. A record that fails gets one `rejected:<reason>` receipt,
   nothing else: no state is loaded, nothing remembered (the ids may not name a row);
1. loads the thread's state from `store` (nothing is cached per thread between inputs or
   calls: an idle thread costs no memory, and the store, or the overlay over it, is the
   only place state lives);
2. looks up the `Facts`: was the message id seen, the provenance verdict of the
   `Verifier` and its reason, the attempt number;
3. calls `fold(state, input, facts)`;
4. interprets every effect (a `match` closed by `assert_never`) into store writes and
   output records, and writes the new state row (deleting the thread's rows when the
   new state is None).

Writes go to a per-input `Overlay` over `store`, then into `store` itself through
`store.apply`: pass an `Overlay` (as the processor does) and nothing reaches the disk
before the checkpoint commits; `StepOutput.changes` lists the same writes as changelog
records (key bytes, value bytes or None for a tombstone).

Failures. If `fold` or the interpretation of its effects raises, that input's writes are
dropped and it is tried again, up to `max_attempts` times (`Facts.attempt` counts them,
so the receipt shows `retry_count`); then `park_on_failure` parks the thread with the
error as its reason and the input is recorded in `StepOutput.parked`. A poison input
therefore costs a bounded number of attempts and a loud receipt: never a crash loop,
never a silent loss. If parking fails too, the input gets a bare `parked` receipt
built without the thread's state (and still goes to `parked`): `step` never raises
because of one input, so no input can stop a partition or its processor.

Size. No input may make a record Kafka refuses (that would fail the checkpoint and stop
the partition). An input whose fold would write a row over `ROW_MAX_BYTES`, grow a
thread holding inputs past `STATE_HOLD_MAX_BYTES`, or send an input over
`MAX_INPUT_BYTES_CEILING` once the processor signs it (`SIGNATURE_ROOM`) is refused
whole: its writes are dropped and its one receipt is `rejected:too_large` with the record
it would have made (before any of this, the runtimes park inputs too large to decode:
`admission`). A child's inherited history is
cut to its most recent entries that fit one input (`_creation`); a fork's never is (a
`fork` control whose entries do not fit one input is refused whole, `_fork_creation`). The bounds are
constants, not settings, so a replay refuses exactly what the live run refused.

Provenance: `Verifier.verify(input, state)` (`torpor.processors.fold.verify`) gives the
verdict the fold sees, judged against the state loaded in 1. `SourceVerifier`, the
default, is development mode: nothing is checked. The processor runs `KeyringVerifier`
when a key ring is configured.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, assert_never

from torpor.processors.fold.effects import (
    AppendHistory,
    DispatchTool,
    EmitEvent,
    EmitReceipt,
    ForkThread,
    Loopback,
    RememberInput,
    RequestCompletion,
    SpawnChild,
    Transition,
)
from torpor.processors.fold.facts import Facts
from torpor.processors.fold.state import GENESIS_HEAD, Status, ThreadState
from torpor.processors.fold.transitions import fold, park_on_failure, refuse_at_door, refuse_whole
from torpor.processors.fold.verify import SourceVerifier, Verifier
from torpor.processors.store import keys
from torpor.processors.store.kv import Change, Overlay, Store
from torpor.processors.store.statecodec import (
    WITHOUT_ANSWERED,
    WITHOUT_CONFIG,
    encode_entry,
    encode_request,
    encode_state_rows,
)
from torpor.processors.store.tables import (
    HistoryAppend,
    is_seen_in,
    load_state,
    read_prefix_within,
    visible_entries,
    with_sender,
)
from torpor.schemas.codec import encode_value
from torpor.schemas.frozen import fast_inits
from torpor.schemas.ids import id_problem
from torpor.schemas.records import (
    DEFERRED,
    PARKED,
    CreateThread,
    Dispatch,
    HistoryEntry,
    Input,
    Receipt,
    SummaryEntry,
    ThreadConfig,
    ThreadEvent,
    rejected,
)
from torpor.streams.config import MAX_INPUT_BYTES_CEILING, ROW_MAX_BYTES, STATE_HOLD_MAX_BYTES
from torpor.streams.partitioner import partition_for

log = logging.getLogger(__name__)

TOO_LARGE: Final = rejected("too_large")
# Room in a child's CreateThread for its config, initial input and envelope, and per
# inherited entry for what its encoding in a CreateThread adds to its row.
CREATION_MARGIN: Final = 16_384
ENTRY_MARGIN: Final = 16

SIGNATURE_ROOM: Final = 256
"""Bytes a loopback may grow by after `step` bounds it: the processor signs it as it goes
out (a 64-byte signature and a key id of at most 128 characters, with their Avro lengths:
196 bytes), and the new thread's door refuses it over `MAX_INPUT_BYTES_CEILING` signed. A
fork's creation is the one loopback that can come that close (a child's is cut with
`CREATION_MARGIN`, a completion with the model stage's margin)."""

MAX_ATTEMPTS: Final = 3
"""Tries per input before its thread is parked: a pure fold that raised once will raise
again, so retries only help against shell-side faults; three keeps a poison input cheap."""


@dataclass(frozen=True, slots=True, init=False)
class StepRecord:
    """One input to fold, with where it was read from (filled into its receipt).

    `key`: the Kafka record's key, None where there is none (local mode); then only the
    ids are checked at the door. `appended_at`: when the broker appended it.

    Its own `__init__` of plain stores, built per input: compiled, a native class's (~0.13 us
    called with positions from the runtimes' Python, ~0.45 with keywords, against ~0.8 for
    the one `dataclasses` generates); run as Python, replaced by `fast_inits`
    (`torpor.processors.fold.effects` says why).
    """

    input: Input
    partition: int | None = None
    offset: int | None = None
    key: bytes | None = None
    # When the broker appended it (None: not known, as in local mode): the time the
    # verifier judges key windows and expiry at, which no writer chooses.
    appended_at: int | None = None

    def __init__(self, input: Input, partition: int | None = None, offset: int | None = None,
                 key: bytes | None = None, appended_at: int | None = None) -> None:
        self.input = input  # type: ignore[misc]
        self.partition = partition  # type: ignore[misc]
        self.offset = offset  # type: ignore[misc]
        self.key = key  # type: ignore[misc]
        self.appended_at = appended_at  # type: ignore[misc]


@dataclass(frozen=True, slots=True)
class ParkedInput:
    """An input whose fold kept failing: it went to `parked` with its error (DESIGN 3)."""

    record: StepRecord
    reason: str
    attempts: int


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What one `step` produced, in fold order: the checkpoint writes all of it or none.

    `changes`: store writes, also the changelog records. `dispatches`: the outbox.
    `loopbacks`: inputs for the `inputs` topic (children, parents, the thread itself).
    `events` and `receipts`: their topics (one receipt per input). `completions`: work
    for the model stage, to run only after the commit. `parked`: inputs whose fold failed.
    `appended`: per folded input that appended history, its entries and chain heads, for
    the model stage's `HistoryCache.extend` once the checkpoint is committed (not a write:
    the rows are in `changes`).
    """

    changes: tuple[Change, ...] = ()
    dispatches: tuple[Dispatch, ...] = ()
    loopbacks: tuple[Input, ...] = ()
    events: tuple[ThreadEvent, ...] = ()
    receipts: tuple[Receipt, ...] = ()
    completions: tuple[RequestCompletion, ...] = ()
    parked: tuple[ParkedInput, ...] = ()
    appended: tuple[HistoryAppend, ...] = ()


class _Collected:
    """The step's outputs as they accumulate (local to one `step` call). A plain class, not a
    dataclass: compiled, it is built without the interpreter (`Draft` says why)."""

    __slots__ = ("appended", "completions", "dispatches", "events", "loopbacks", "parked", "receipts",
                 "too_large")

    def __init__(self) -> None:
        self.dispatches: list[Dispatch] = []
        self.loopbacks: list[Input] = []
        self.events: list[ThreadEvent] = []
        self.receipts: list[Receipt] = []
        self.completions: list[RequestCompletion] = []
        self.parked: list[ParkedInput] = []
        self.appended: list[HistoryAppend] = []
        self.too_large: str | None = None  # an effect that cannot fit one record: the input is refused whole


def step(
    store: Store,
    records: Sequence[StepRecord],
    *,
    verifier: Verifier | None = None,
    default_config: ThreadConfig | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    partitions: int | None = None,
) -> StepOutput:
    """Fold `records` in order over `store`; return what the checkpoint must write.

    `default_config` is what a first `UserMessage` may create an unknown thread with.
    `partitions`: how many partitions `inputs` has, to check that each keyed record is on
    its thread's partition (None: not checked). Never raises for an input's sake: even a
    store read that fails while folding one input ends as that input's `parked` receipt.
    Raises only if writing the batch to `store` fails (abort the checkpoint).
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, not {max_attempts}")
    judge = verifier or SourceVerifier()
    batch = Overlay(store)
    out = _Collected()
    for record in records:
        problem = door_problem(record, partitions)
        if problem is not None:
            _refuse(record, rejected(problem[0]), problem[1], out)
            continue
        _fold_one(batch, record, judge, default_config, max_attempts, out)
    changes = batch.changes()
    store.apply(changes)
    return StepOutput(
        changes=changes,
        dispatches=tuple(out.dispatches),
        loopbacks=tuple(out.loopbacks),
        events=tuple(out.events),
        receipts=tuple(out.receipts),
        completions=tuple(out.completions),
        parked=tuple(out.parked),
        appended=tuple(out.appended),
    )


def door_problem(record: StepRecord, partitions: int | None) -> tuple[str, str] | None:
    """(reason, detail) if `record` must be refused before its thread is looked up, else None."""
    item = record.input
    problem = id_problem(item.thread_id)
    if problem is not None:
        return "invalid_thread_id", f"thread id {_shown(item.thread_id)}: {problem}"
    problem = id_problem(item.message_id)
    if problem is not None:
        return "invalid_message_id", f"message id {_shown(item.message_id)}: {problem}"
    if record.key is None:
        return None
    expected = item.thread_id.encode("utf-8")
    if record.key != expected:
        return "key_mismatch", f"record key {_shown(record.key)} is not thread id {item.thread_id!r}"
    if partitions is not None and record.partition is not None:
        home = partition_for(expected, partitions)
        if home != record.partition:
            return "wrong_partition", f"thread {item.thread_id!r} belongs on partition {home}"
    return None


def sender_digest(input: Input) -> bytes:
    """Who sent `input`, as its seen row remembers it: 16 bytes of SHA-256 over its source and
    key id. A message id is an idempotency key per sender: a sender's retry under the same
    id is a duplicate, whatever else differs (a fresh `created_at`, a new signature); an
    input from another sender with that id is judged on its own (finding F4). Inputs
    refused for their provenance are never remembered, so a forger cannot claim a sender."""
    return _digest(input.source, input.key_id)


@functools.lru_cache(maxsize=1024)  # a few senders (processor, connectors, gateways) send most inputs
def _digest(source: str, key_id: str | None) -> bytes:
    return hashlib.sha256(f"{source}\0{key_id or ''}".encode()).digest()[:16]


def _shown(value: str | bytes) -> str:
    """`value` for a receipt or a log line: escaped (a newline cannot forge a line), cut at 80."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _refuse(record: StepRecord, disposition: str, detail: str, out: _Collected) -> None:
    """One receipt for `record`, built without its thread's state; nothing else."""
    out.receipts.append(refuse_at_door(record.input, disposition, detail, record.partition, record.offset))
    log.warning("input refused without folding: %s", detail, extra={
        "partition": record.partition, "offset": record.offset, "disposition": disposition})


def _fold_one(
    batch: Overlay,
    record: StepRecord,
    judge: Verifier,
    default_config: ThreadConfig | None,
    max_attempts: int,
    out: _Collected,
) -> None:
    item = record.input
    error = "unknown"
    sender = sender_digest(item)
    for attempt in range(max_attempts):
        scratch = Overlay(batch)  # this input's writes, dropped if anything below raises
        mark = _Collected()
        try:
            state = load_state(scratch, item.thread_id, writer=True)
            verdict = judge.verify(item, state, record.appended_at)
            seen_row = scratch.get(keys.seen_key(item.thread_id, item.message_id))
            facts = Facts(
                seen=is_seen_in(seen_row, sender),
                provenance=verdict.provenance,
                provenance_reason=verdict.reason,
                attempt=attempt,
                default_config=default_config,
                partition=record.partition,
                offset=record.offset,
            )
            transition = fold(state, item, facts)
            _interpret(scratch, record, sender, state, transition, mark, seen_row, seen_read=True)
            too_large = _size_problem(scratch, item.thread_id, mark)
        except Exception as exc:  # any bug in the fold or the shell: bounded, then parked
            error = f"{type(exc).__name__}: {exc}"
            log.warning("fold failed (attempt %d of %d): %s", attempt + 1, max_attempts, error,
                        extra=_where(record))
            continue
        if too_large is not None:  # its writes are dropped with `scratch`
            receipt = refuse_whole(state, item, facts, TOO_LARGE, too_large)
            out.receipts.append(receipt)
            log.warning("input refused: %s", too_large, extra={**_where(record), "disposition": TOO_LARGE})
            return
        scratch.commit()
        _merge(out, mark)
        if log.isEnabledFor(logging.DEBUG):  # not worth a dict per input when nobody listens
            log.debug("folded", extra={**_where(record), "disposition": mark.receipts[-1].disposition})
        return
    # Bounded retries are spent: park the thread loudly through the fold's own last resort.
    out.parked.append(ParkedInput(record, error, max_attempts))
    scratch = Overlay(batch)
    mark = _Collected()
    try:
        state = load_state(scratch, item.thread_id, writer=True)
        transition = park_on_failure(state, item, error, max_attempts, record.partition, record.offset)
        _interpret(scratch, record, sender, state, transition, mark)
    except Exception as exc:  # not even parking works: a receipt without the state, and go on
        log.error("parking the thread failed too: %s: %s", type(exc).__name__, exc,
                  extra={**_where(record), "disposition": PARKED})
        _refuse(record, PARKED, f"failed after {max_attempts} attempts: {error}; and parking the "
                                f"thread failed too: {type(exc).__name__}: {exc}", out)
        return
    scratch.commit()
    _merge(out, mark)
    log.error(
        "input parked after %d attempts: %s", max_attempts, error,
        extra={**_where(record), "disposition": "parked"},
    )


def _where(record: StepRecord) -> dict[str, object]:
    """The log fields of `record` (built only when a line is logged: not worth a dict per input)."""
    item = record.input
    return {"thread_id": item.thread_id, "partition": record.partition, "offset": record.offset,
            "message_id": item.message_id}


def _size_problem(rows: Overlay, thread_id: str, out: _Collected) -> str | None:
    """Why this input's writes and records are too large for Kafka (module docstring), or None."""
    if out.too_large is not None:
        return out.too_large
    for _, value in rows.changes():
        if value is not None and len(value) > ROW_MAX_BYTES:
            return f"folding it would write a row of {len(value)} bytes, more than {ROW_MAX_BYTES}"
    if out.receipts and out.receipts[-1].disposition in (DEFERRED, PARKED):
        size = _state_size(rows, thread_id)
        if size is not None and size > STATE_HOLD_MAX_BYTES:
            return (f"the thread holds too many inputs already: holding this one makes its state "
                    f"{size} bytes, more than {STATE_HOLD_MAX_BYTES}; send it when the thread runs")
    for loopback in out.loopbacks:
        size = len(encode_value(loopback))
        if size + SIGNATURE_ROOM > MAX_INPUT_BYTES_CEILING:
            return (f"folding it would send thread {loopback.thread_id!r} an input of {size} bytes "
                    f"before the processor signs it ({SIGNATURE_ROOM} kept for that), more than "
                    f"{MAX_INPUT_BYTES_CEILING}")
    return None


def _state_size(rows: Overlay, thread_id: str) -> int | None:
    """The size of the thread's state as one row with its config and answered call ids
    inline (the first form): the hold limit judges what it always judged, so a replay of an
    older log refuses what the live run refused (review 20). Inline, a side row adds its
    field's `"name":` and one comma (`answered_calls` is the first of the sorted fields,
    `config` neither first nor last), and the row drops its marker byte."""
    raw = rows.get(keys.state_key(thread_id))
    if raw is None or raw[:1] == b"{":
        return None if raw is None else len(raw)
    config = rows.get(keys.config_key(thread_id)) or b""
    size = len(raw) - len(WITHOUT_CONFIG) + len('"config":') + len(config) + 1
    if raw[:1] == WITHOUT_ANSWERED:
        size += len('"answered_calls":') + len(rows.get(keys.answered_key(thread_id)) or b"") + 1
    return size


def _merge(out: _Collected, mark: _Collected) -> None:
    out.dispatches.extend(mark.dispatches)
    out.loopbacks.extend(mark.loopbacks)
    out.events.extend(mark.events)
    out.receipts.extend(mark.receipts)
    out.completions.extend(mark.completions)
    out.appended.extend(mark.appended)


def _interpret(
    rows: Overlay, record: StepRecord, sender: bytes, before: ThreadState | None, transition: Transition,
    out: _Collected, seen_row: bytes | None = None, *, seen_read: bool = False,
) -> None:
    """Turn one transition into writes on `rows` and records in `out`.

    `seen_read`: `seen_row` is the input's seen row as read before folding (None: there
    was none), so remembering the input does not read it again."""
    thread_id = record.input.thread_id
    known_seen = seen_read
    if transition.state is None and before is not None:
        _delete_thread(rows, thread_id)
    requested: RequestCompletion | None = None
    remember: bytes | None = None
    appended: list[HistoryEntry] = []
    for effect in transition.effects:
        # The commonest kinds first: compiled, each `case` is an isinstance call (about
        # thirty per input in the order of the effects' docstring).
        match effect:
            case AppendHistory(entry=entry, canonical=canonical):
                rows.put(keys.history_key(thread_id, entry.seq), encode_entry(entry, canonical))
                appended.append(entry)
                if isinstance(entry.body, SummaryEntry):
                    rows.put(keys.summary_key(thread_id), keys.encode_seq(entry.seq))
            case EmitEvent(event=event):
                out.events.append(event)
            case RememberInput(message_id=message_id):
                remember = keys.seen_key(thread_id, message_id)
                known_seen = known_seen and message_id == record.input.message_id
            case EmitReceipt(receipt=receipt):
                out.receipts.append(receipt)  # placed by the fold: `Facts` carried the place
            case RequestCompletion():
                requested = effect
                out.completions.append(effect)
            case DispatchTool(dispatch=dispatch):
                out.dispatches.append(dispatch)
            case Loopback(input=loopback):
                out.loopbacks.append(loopback)
            case SpawnChild():
                out.loopbacks.append(_creation(rows, thread_id, effect))
            case ForkThread():
                made = _fork_creation(rows, thread_id, effect)
                if isinstance(made, str):
                    out.too_large = made
                else:
                    out.loopbacks.append(made)
            case _:
                assert_never(effect)
    if not out.receipts:
        raise RuntimeError(f"the fold returned no receipt for input {record.input.message_id}")
    if remember is not None:
        rows.put(remember, with_sender(seen_row if known_seen else rows.get(remember), sender))
    _write_state(rows, thread_id, before, transition.state, requested)
    if appended:
        _hand_over_appended(thread_id, before, transition.state, appended, out)


def _hand_over_appended(thread_id: str, before: ThreadState | None, after: ThreadState | None,
                        appended: list[HistoryEntry], out: _Collected) -> None:
    """Record the entries this input appended for `HistoryCache.extend`, when they end where
    `after`'s history ends and start where `before`'s ended (its head is theirs to extend).
    Whether the seqs run without a gap is `extend`'s check, with the cache's own."""
    first, last = appended[0].seq, appended[-1].seq
    if after is None or after.history_len != last + 1:
        return
    if first == 0:
        head_before = GENESIS_HEAD
    elif before is not None and before.history_len == first:
        head_before = before.head
    else:
        return
    out.appended.append(HistoryAppend(thread_id, first, tuple(appended), head_before, after.head))


def _delete_thread(rows: Overlay, thread_id: str) -> None:
    """Tombstone every row of `thread_id` but its seen rows (the changelog mirrors them).

    The seen rows stay (a message id and its senders' digests each, no content): every
    input the thread applied, produced again after the delete (its signed creation, a
    user's message, an operator's stop), is then a `duplicate`, whether or not the thread
    was created anew meanwhile. A time rule cannot do this: it trusts writers' clocks
    (a creator's running ahead outlives the tombstone; one input stamped far ahead refuses
    every later re-creation) and covers creations only."""
    seen = keys.thread_prefix(thread_id) + keys.SEEN
    for key, _ in list(rows.iterate(keys.thread_prefix(thread_id))):
        if not key.startswith(seen):
            rows.delete(key)


def _write_state(
    rows: Overlay, thread_id: str, before: ThreadState | None, state: ThreadState | None,
    requested: RequestCompletion | None,
) -> None:
    if state is not None:
        written = encode_state_rows(state)
        rows.put(keys.state_key(thread_id), written.state)
        # A side row (`WITHOUT_ANSWERED`) is written only when it changes (a creation, a
        # model switch, an answered call, a state row of an older form carried it inline):
        # most inputs leave it alone, and most of those are known to (`kept`) without
        # reading the row. `kept` speaks of the rows `before` was read from: with no
        # `before` (a creation) the memo may speak of another store's thread of that id (a
        # replay beside the live run); but then the thread has no side rows (a deletion
        # takes them), so they are written unread.
        for key, row, kept in ((keys.config_key(thread_id), written.config, written.config_kept),
                               (keys.answered_key(thread_id), written.answered, written.answered_kept)):
            if before is None or (not kept and rows.get(key) != row):
                rows.put(key, row)
    elif rows.get(keys.state_key(thread_id)) is not None:
        rows.delete(keys.state_key(thread_id))
    # The awaiting-model index: one row per thread with a completion in flight, so a
    # restarted model stage re-issues exactly those requests without scanning all threads.
    index = keys.awaiting_model_key(thread_id)
    if requested is not None and requested.thread_id == thread_id:
        rows.put(index, encode_request(requested))
    elif (state is None or state.status is not Status.AWAITING_MODEL) and rows.get(index) is not None:
        rows.delete(index)


def _creation(rows: Overlay, thread_id: str, spawn: SpawnChild) -> Input:
    """The child's `CreateThread`, carrying the parent's model-visible entries of the range."""
    inherited = _fitting(visible_entries(rows, thread_id, spawn.from_seq, spawn.up_to_seq), spawn)
    return _loopback(spawn.message_id, spawn.child_thread_id, spawn.created_at,
                     CreateThread(config=spawn.config, inherited=inherited, initial=spawn.initial))


def _fork_creation(rows: Overlay, thread_id: str, fork: ForkThread) -> Input | str:
    """The fork's `CreateThread`, carrying the source's entries `0..at_seq` whole and unchanged,
    or why it cannot (the entries alone pass one input: the control is refused whole).

    Never cut, unlike a child's: a fork's history is the source's prefix or nothing, so one
    that does not fit an input is refused whole by `_size_problem` (`rejected:too_large`).
    The prefix is read only until it passes one input's bytes: a long thread's history may
    be gigabytes, and holding it in memory to refuse it could end the process."""
    last = fork.origin.at_seq
    entries = read_prefix_within(rows, thread_id, last + 1, MAX_INPUT_BYTES_CEILING)
    if entries is None:
        return (f"forking it would send thread {fork.new_thread_id!r} its entries 0 to {last}, "
                f"more than {MAX_INPUT_BYTES_CEILING} bytes (the most one input may have)")
    return _loopback(fork.message_id, fork.new_thread_id, fork.created_at,
                     CreateThread(config=fork.config, inherited=entries, initial=(), fork=fork.origin))


def _loopback(message_id: str, thread_id: str, created_at: int, body: CreateThread) -> Input:
    """A creation the processor sends to another thread: source `processor`, signed (if a
    key is configured) by the output writer, never expiring."""
    return Input(message_id=message_id, thread_id=thread_id, created_at=created_at, source="processor",
                 expires_at=None, key_id=None, signature=None, body=body)


def _fitting(entries: tuple[HistoryEntry, ...], spawn: SpawnChild) -> tuple[HistoryEntry, ...]:
    """The most recent of `entries` that fit one input: a child's CreateThread travels as one
    record. What is cut is logged; the child still starts (a parent waits on it)."""
    budget = MAX_INPUT_BYTES_CEILING - CREATION_MARGIN
    kept = 0
    for entry in reversed(entries):
        budget -= len(encode_entry(entry)) + ENTRY_MARGIN
        if budget < 0:
            break
        kept += 1
    if kept < len(entries):
        log.warning("child %s inherits only the last %d of %d entries: the rest do not fit one input",
                    spawn.child_thread_id, kept, len(entries), extra={"thread_id": spawn.child_thread_id})
    return entries[len(entries) - kept:]

# Records are built several times per input: a faster __init__, same signature (frozen.py).
fast_inits(__name__)
