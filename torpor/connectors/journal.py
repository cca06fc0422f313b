"""The effect journal: what a connector has started, finished, or lost track of (DESIGN 7).

Contract. One `EffectJournal` per connector process, in a RocksDB directory of its own
(`path`; None keeps it in memory, for local mode and tests). An effect is one invoke
dispatch, keyed by its `request_id`, in one of these states:

    dispatched --the tool answered--> done --the answer was delivered--> delivered
        |   \\--cancel / close_thread--> cancelled
        +--found at start-up--> unknown --reconcile / re-run--> dispatched or done

- `begin(dispatch)` journals an invoke before the tool sees it and says whether to run
  it: a request id already journaled is never run again (a redelivered dispatch), and a
  `done` one has its stored answer re-sent instead (`EffectJournal.entry`).
- `finish(request_id, answer)` stores the tool's final input (a non-subscription
  `ToolResult`, the final `ToolEvent`, a `TimerFired`) before it is produced; then
  `delivered(request_id)` once the broker acknowledged it.
- `follow(dispatch)` keeps a dispatch for a running effect (an approval decision), so a
  re-run after a crash gets it again; `cancel` ends a running effect.
- `recover()`, at start-up, turns every `dispatched` effect into `unknown` (the process
  died while it ran: the tool's `reconcile` hook decides whether it happened) and
  returns what needs attention: the unknown effects and the finished but undelivered ones.

Durability. Every write goes through RocksDB's write-ahead log before the call returns,
so a journaled effect survives a kill -9 of the connector (the WAL is written to the
file at once; only a machine crash can lose what is not synced). Against a machine
crash, the writes that a run or a send depends on are synced: `begin` (before the tool
sees the dispatch), `finish` (before the answer is produced), `restart`, `follow`,
`cancel`, `recover`, `prune`. `begin` writes its two rows as one synced batch. `delivered`
is not synced: losing it leaves the effect `done`, and its answer is re-sent at the next
start, which the processor absorbs as a duplicate (the message id derives from the
request id). Group commit: inside `with journal.group():` writes are not synced one by
one; the block's end syncs them all at once (one fsync for a batch of dispatches, one for
the answers given while they are handed over: `intake.JournaledIntake.route_all`), so a
caller must let no tool see those dispatches, nor produce those answers, before the
block ends (`is_synced` says whether it has). Because the journal owns an effect from
`begin` on, the runtime may commit the dispatch's outbox offset at once: a week-long
timer holds no offset back.

`prune(before_ms)` forgets delivered and cancelled effects older than a retention window
(a dispatch redelivered after that would run again).

`on_moved`, when set (the connector's metrics), is called with each effect this process
moves into a state (begun or re-run: `dispatched`; `done`, `delivered`, `cancelled`;
`unknown` at recovery), after the write. Followups and pruning move no effect.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Final

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from torpor.connectors.effectrow import FINISHED, Effect, EffectState, EncodedEffect, decode_row, encoded
from torpor.schemas.records import Dispatch, Input

__all__ = ["FINISHED", "KNOWN_EFFECTS", "Effect", "EffectJournal", "EffectState"]

KNOWN_EFFECTS: Final = 4096
"""Effects kept in memory after they were written (`EffectJournal._known`): a few batches of calls."""
_EFFECT: Final = b"e/"  # e/<request id> -> the effect (`effectrow`: its format)
_CALL: Final = b"c/"  # c/<thread id>\0<call id> -> the request id of the call's latest invoke


class EffectJournal:
    """The journal of one connector (module docstring). Not thread-safe: one event loop owns it."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._grouped = 0  # depth of `group()` blocks: inside one, writes wait for its sync
        self._unsynced = False  # a write inside the group is not synced yet
        self.syncs = 0  # synced writes so far (what group commit saves; read by tests and benchmarks)
        # The effects this process wrote or read last, with their records' bytes: the journal
        # has one writer (RocksDB locks the directory), so they are what their rows decode to.
        # A tool call reads its effect back three times (the answer, finish, delivered) and
        # rewrites it twice: without this, three decodes and the records encoded each time.
        # Bounded: the memory does not grow with the effects journaled.
        self._known: OrderedDict[str, EncodedEffect] = OrderedDict()
        self.on_moved: Callable[[Effect], None] | None = None  # module docstring
        self._db: MutableMapping[bytes, bytes]
        if path is None:
            self._db = {}
            self._rocks: Rdict | None = None
        else:
            # Arguments and results are private: only the connector's user may read them (0700,
            # tightened if an older run made it wider).
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.chmod(0o700)
            self._rocks = Rdict(str(path), Options(raw_mode=True))
            self._sync = WriteOptions()
            self._sync.sync = True  # a journaled effect must survive a machine crash (module docstring)
            self._no_sync = WriteOptions()  # still through the WAL: survives a kill -9
            self._db = self._rocks  # type: ignore[assignment]

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Group commit: the writes inside are synced once, when the outermost block ends.

        Until then they are in the WAL (safe from a kill -9) but not on disk: let no tool
        see a dispatch begun inside, and produce no answer finished inside, before the
        block has ended. If the block raises, what it wrote is synced all the same.
        """
        self._grouped += 1
        try:
            yield
        finally:
            self._grouped -= 1
            if self._grouped == 0 and self._unsynced:
                if self._rocks is not None:
                    self._rocks.flush_wal(True)
                    self.syncs += 1
                self._unsynced = False  # only once synced: a sync that raised leaves it True

    @property
    def is_synced(self) -> bool:
        """Every write that is to be synced is: nothing waits for a `group` to end."""
        return not self._unsynced

    # --- writes ------------------------------------------------------------------------

    def begin(self, dispatch: Dispatch, now_ms: int) -> Effect | None:
        """Journal an invoke. None: new, run it. Otherwise the effect already journaled."""
        found = self.entry(dispatch.request_id)
        if found is not None:
            return found
        effect = encoded(Effect(dispatch, EffectState.DISPATCHED, now_ms))
        self._write_rows(((_effect_key(dispatch.request_id), effect.row()),
                          (_call_key(dispatch.thread_id, dispatch.call_id), dispatch.request_id.encode())))
        self._remember(effect)
        self._moved(effect.effect)
        return None

    def restart(self, request_id: str, now_ms: int) -> None:
        """An unknown effect is run again (its `reconcile` found no trace of it)."""
        self._move(request_id, EffectState.DISPATCHED, now_ms)

    def finish(self, request_id: str, answer: Input, now_ms: int, encoded: bytes | None = None) -> None:
        """Store the effect's final answer, before it is produced. `encoded`: the answer's
        single-object encoding (`encode_value`), if the caller has it: not encoded again."""
        done = dataclasses.replace(self._require(request_id), state=EffectState.DONE, updated_at=now_ms,
                                   answer=answer)
        self._put(done, encoded)
        self._moved(done)

    def delivered(self, request_id: str, now_ms: int) -> None:
        """The broker acknowledged the final answer: nothing is left to do for this effect."""
        effect = self.entry(request_id)
        if effect is not None and effect.state == EffectState.DONE:
            # Not synced (module docstring): if a machine crash loses it, the answer is re-sent.
            delivered = self._encoded(dataclasses.replace(effect, state=EffectState.DELIVERED,
                                                          updated_at=now_ms))
            self._write_rows(((_effect_key(request_id), delivered.row()),), durable=False)
            self._remember(delivered)
            self._moved(delivered.effect)

    def follow(self, dispatch: Dispatch, now_ms: int) -> bool:
        """Keep a dispatch for the call's running effect (an approval decision); False: none runs."""
        effect = self.running_effect(dispatch.thread_id, dispatch.call_id)
        if effect is None:
            return False
        if all(f.request_id != dispatch.request_id or f.kind != dispatch.kind for f in effect.followups):
            self._put(dataclasses.replace(effect, followups=(*effect.followups, dispatch), updated_at=now_ms))
        return True

    def running_calls(self, thread_id: str) -> list[str]:
        """Call ids of the thread's effects that are not finished (for `close_thread`)."""
        return [e.dispatch.call_id for e in self.effects()
                if e.dispatch.thread_id == thread_id and e.state not in FINISHED]

    def running_effect(self, thread_id: str, call_id: str) -> Effect | None:
        """The call's latest effect, if it is not finished (None: none runs)."""
        request = self._get(_call_key(thread_id, call_id))
        effect = None if request is None else self.entry(request.decode())
        return None if effect is None or effect.state in FINISHED else effect

    def cancel(self, thread_id: str, call_id: str, now_ms: int) -> str | None:
        """Cancel the call's running effect; return its request id (None: nothing ran)."""
        effect = self.running_effect(thread_id, call_id)
        if effect is None:
            return None
        cancelled = dataclasses.replace(effect, state=EffectState.CANCELLED, updated_at=now_ms)
        self._put(cancelled)
        self._moved(cancelled)
        return effect.request_id

    def recover(self, now_ms: int) -> list[Effect]:
        """At start-up: `dispatched` becomes `unknown`; return the unknown and undelivered effects."""
        found: list[Effect] = []
        with self.group():  # one sync for all of them: nothing runs until this returns
            for effect in list(self.effects()):
                if effect.state in (EffectState.DISPATCHED, EffectState.UNKNOWN):
                    effect = dataclasses.replace(effect, state=EffectState.UNKNOWN, updated_at=now_ms)
                    self._put(effect)
                    self._moved(effect)
                    found.append(effect)
                elif effect.state == EffectState.DONE:
                    found.append(effect)
        return found

    def prune(self, before_ms: int) -> int:
        """Forget delivered and cancelled effects last touched before `before_ms`; return how many."""
        gone = 0
        with self.group():  # one sync for the whole sweep
            for effect in list(self.effects()):
                settled = effect.state in (EffectState.DELIVERED, EffectState.CANCELLED)
                if settled and effect.updated_at < before_ms:
                    self._delete(_effect_key(effect.request_id))
                    self._known.pop(effect.request_id, None)
                    call = _call_key(effect.dispatch.thread_id, effect.dispatch.call_id)
                    if self._get(call) == effect.request_id.encode():
                        self._delete(call)
                    gone += 1
        return gone

    # --- reads -------------------------------------------------------------------------

    def entry(self, request_id: str) -> Effect | None:
        known = self._known.get(request_id)
        if known is not None:
            return known.effect
        raw = self._get(_effect_key(request_id))
        return None if raw is None else decode_row(raw).effect

    def effects(self) -> Iterator[Effect]:
        for key, value in list(self._db.items()):
            if key.startswith(_EFFECT):
                yield decode_row(value).effect

    def running(self) -> int:
        """Effects journaled but not finished: a tool still owes an answer for them."""
        return sum(1 for e in self.effects() if e.state in (EffectState.DISPATCHED, EffectState.UNKNOWN))

    def close(self) -> None:
        if self._rocks is not None:
            self._rocks.close()
            self._rocks = None

    # --- storage -----------------------------------------------------------------------

    def _require(self, request_id: str) -> Effect:
        effect = self.entry(request_id)
        if effect is None:
            raise KeyError(f"no journaled effect for request {request_id!r}")
        return effect

    def _move(self, request_id: str, state: EffectState, now_ms: int) -> None:
        moved = dataclasses.replace(self._require(request_id), state=state, updated_at=now_ms)
        self._put(moved)
        self._moved(moved)

    def _moved(self, effect: Effect) -> None:
        if self.on_moved is not None:
            self.on_moved(effect)

    def _put(self, effect: Effect, answer: bytes | None = None) -> None:
        row = self._encoded(effect, answer)
        self._write(_effect_key(effect.request_id), row.row())
        self._remember(row)

    def _encoded(self, effect: Effect, answer: bytes | None = None) -> EncodedEffect:
        """`effect` encoded, with the bytes of the records it shares with the one known before."""
        return encoded(effect, self._known.get(effect.request_id), answer)

    def _remember(self, effect: EncodedEffect) -> None:
        """`effect` was just written: serve `entry` from memory (see `_known`)."""
        request_id = effect.effect.request_id
        self._known.pop(request_id, None)
        self._known[request_id] = effect
        if len(self._known) > KNOWN_EFFECTS:
            self._known.popitem(last=False)

    def _get(self, key: bytes) -> bytes | None:
        if self._rocks is not None:
            value = self._rocks.get(key)
            return value if isinstance(value, bytes) else None
        return self._db.get(key)

    def _write(self, key: bytes, value: bytes) -> None:
        self._write_rows(((key, value),))

    def _delete(self, key: bytes) -> None:
        self._write_rows(((key, None),))

    def _write_rows(self, rows: tuple[tuple[bytes, bytes | None], ...], durable: bool = True) -> None:
        """Write `rows` (None: delete) atomically; synced if `durable`, unless a group syncs later."""
        if self._rocks is None:
            for key, value in rows:
                if value is None:
                    self._db.pop(key, None)
                else:
                    self._db[key] = value
            return
        batch = WriteBatch(raw_mode=True)
        for key, value in rows:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        sync = durable and self._grouped == 0
        self._unsynced = self._unsynced or (durable and not sync)
        self._rocks.write(batch, self._sync if sync else self._no_sync)
        self.syncs += sync


def _effect_key(request_id: str) -> bytes:
    return _EFFECT + request_id.encode("utf-8")


def _call_key(thread_id: str, call_id: str) -> bytes:
    return _CALL + thread_id.encode("utf-8") + b"\x00" + call_id.encode("utf-8")
