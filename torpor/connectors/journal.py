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

Every write is synced to the RocksDB write-ahead log before the call returns, so a
journaled effect survives a kill -9 of the connector. Because the journal owns an effect
from `begin` on, the runtime may commit the dispatch's outbox offset at once: a week-long
timer holds no offset back. `prune(before_ms)` forgets delivered and cancelled effects
older than a retention window (a dispatch redelivered after that would run again).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rocksdict import Options, Rdict, WriteOptions

from torpor.schemas.codec import decode_value, encode_value
from torpor.schemas.records import Dispatch, Input

_EFFECT: Final = b"e/"  # e/<request id> -> the effect, JSON
_CALL: Final = b"c/"  # c/<thread id>\0<call id> -> the request id of the call's latest invoke


class EffectState(enum.StrEnum):
    DISPATCHED = "dispatched"
    DONE = "done"
    DELIVERED = "delivered"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


FINISHED: Final = frozenset({EffectState.DONE, EffectState.DELIVERED, EffectState.CANCELLED})


@dataclass(frozen=True, slots=True)
class Effect:
    """One journaled invoke: its dispatch, its state, its final answer once there is one."""

    dispatch: Dispatch
    state: EffectState
    updated_at: int
    answer: Input | None = None
    # Dispatches for the running effect (approval decisions), replayed after a re-run.
    followups: tuple[Dispatch, ...] = ()

    @property
    def request_id(self) -> str:
        return self.dispatch.request_id


class EffectJournal:
    """The journal of one connector (module docstring). Not thread-safe: one event loop owns it."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
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
            self._sync.sync = True  # a journaled effect must survive a kill -9 (module docstring)
            self._db = self._rocks  # type: ignore[assignment]

    # --- writes ------------------------------------------------------------------------

    def begin(self, dispatch: Dispatch, now_ms: int) -> Effect | None:
        """Journal an invoke. None: new, run it. Otherwise the effect already journaled."""
        found = self.entry(dispatch.request_id)
        if found is not None:
            return found
        self._put(Effect(dispatch, EffectState.DISPATCHED, now_ms))
        self._write(_call_key(dispatch.thread_id, dispatch.call_id), dispatch.request_id.encode())
        return None

    def restart(self, request_id: str, now_ms: int) -> None:
        """An unknown effect is run again (its `reconcile` found no trace of it)."""
        self._move(request_id, EffectState.DISPATCHED, now_ms)

    def finish(self, request_id: str, answer: Input, now_ms: int) -> None:
        """Store the effect's final answer, before it is produced."""
        effect = self._require(request_id)
        self._put(dataclasses.replace(effect, state=EffectState.DONE, updated_at=now_ms, answer=answer))

    def delivered(self, request_id: str, now_ms: int) -> None:
        """The broker acknowledged the final answer: nothing is left to do for this effect."""
        effect = self.entry(request_id)
        if effect is not None and effect.state == EffectState.DONE:
            self._put(dataclasses.replace(effect, state=EffectState.DELIVERED, updated_at=now_ms))

    def follow(self, dispatch: Dispatch, now_ms: int) -> bool:
        """Keep a dispatch for the call's running effect (an approval decision); False: none runs."""
        effect = self._running(dispatch.thread_id, dispatch.call_id)
        if effect is None:
            return False
        if all(f.request_id != dispatch.request_id or f.kind != dispatch.kind for f in effect.followups):
            self._put(dataclasses.replace(effect, followups=(*effect.followups, dispatch), updated_at=now_ms))
        return True

    def running_calls(self, thread_id: str) -> list[str]:
        """Call ids of the thread's effects that are not finished (for `close_thread`)."""
        return [e.dispatch.call_id for e in self.effects()
                if e.dispatch.thread_id == thread_id and e.state not in FINISHED]

    def _running(self, thread_id: str, call_id: str) -> Effect | None:
        request = self._get(_call_key(thread_id, call_id))
        effect = None if request is None else self.entry(request.decode())
        return None if effect is None or effect.state in FINISHED else effect

    def cancel(self, thread_id: str, call_id: str, now_ms: int) -> str | None:
        """Cancel the call's running effect; return its request id (None: nothing ran)."""
        effect = self._running(thread_id, call_id)
        if effect is None:
            return None
        self._put(dataclasses.replace(effect, state=EffectState.CANCELLED, updated_at=now_ms))
        return effect.request_id

    def recover(self, now_ms: int) -> list[Effect]:
        """At start-up: `dispatched` becomes `unknown`; return the unknown and undelivered effects."""
        found: list[Effect] = []
        for effect in list(self.effects()):
            if effect.state in (EffectState.DISPATCHED, EffectState.UNKNOWN):
                effect = dataclasses.replace(effect, state=EffectState.UNKNOWN, updated_at=now_ms)
                self._put(effect)
                found.append(effect)
            elif effect.state == EffectState.DONE:
                found.append(effect)
        return found

    def prune(self, before_ms: int) -> int:
        """Forget delivered and cancelled effects last touched before `before_ms`; return how many."""
        gone = 0
        for effect in list(self.effects()):
            settled = effect.state in (EffectState.DELIVERED, EffectState.CANCELLED)
            if settled and effect.updated_at < before_ms:
                self._delete(_effect_key(effect.request_id))
                call = _call_key(effect.dispatch.thread_id, effect.dispatch.call_id)
                if self._get(call) == effect.request_id.encode():
                    self._delete(call)
                gone += 1
        return gone

    # --- reads -------------------------------------------------------------------------

    def entry(self, request_id: str) -> Effect | None:
        raw = self._get(_effect_key(request_id))
        return None if raw is None else _decode(raw)

    def effects(self) -> Iterator[Effect]:
        for key, value in list(self._db.items()):
            if key.startswith(_EFFECT):
                yield _decode(value)

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
        self._put(dataclasses.replace(self._require(request_id), state=state, updated_at=now_ms))

    def _put(self, effect: Effect) -> None:
        self._write(_effect_key(effect.request_id), _encode(effect))

    def _get(self, key: bytes) -> bytes | None:
        if self._rocks is not None:
            value = self._rocks.get(key)
            return value if isinstance(value, bytes) else None
        return self._db.get(key)

    def _write(self, key: bytes, value: bytes) -> None:
        if self._rocks is not None:
            self._rocks.put(key, value, self._sync)
        else:
            self._db[key] = value

    def _delete(self, key: bytes) -> None:
        if self._rocks is not None:
            self._rocks.delete(key, self._sync)
        else:
            self._db.pop(key, None)


def _effect_key(request_id: str) -> bytes:
    return _EFFECT + request_id.encode("utf-8")


def _call_key(thread_id: str, call_id: str) -> bytes:
    return _CALL + thread_id.encode("utf-8") + b"\x00" + call_id.encode("utf-8")


def _encode(effect: Effect) -> bytes:
    # Avro for the records (the wire contract), JSON around them: readable with ldb.
    return json.dumps({
        "state": effect.state.value,
        "updated_at": effect.updated_at,
        "dispatch": encode_value(effect.dispatch).hex(),
        "answer": None if effect.answer is None else encode_value(effect.answer).hex(),
        "followups": [encode_value(f).hex() for f in effect.followups],
    }).encode("utf-8")


def _decode(raw: bytes) -> Effect:
    data = json.loads(raw)
    answer = data["answer"]
    return Effect(
        dispatch=decode_value(bytes.fromhex(data["dispatch"]), Dispatch),
        state=EffectState(data["state"]),
        updated_at=int(data["updated_at"]),
        answer=None if answer is None else decode_value(bytes.fromhex(answer), Input),
        followups=tuple(decode_value(bytes.fromhex(f), Dispatch) for f in data.get("followups", ())),
    )
