"""An effect of the connector journal, and its row: the bytes stored under `e/<request id>`.

Contract. `Effect` is one journaled invoke (`journal` draws its states). `EncodedEffect`
is an effect with the Avro single-object bytes of its records (`encode_value`), and
`row()` lays them out as one journal row; `encoded(effect, like)` encodes an effect,
reusing the bytes of `like` for each record it shares with it (the same object): an
effect is rewritten three or four times in its life (begun, done, delivered), its
dispatch and its answer each encoded once. `decode_row(raw)` reads a row back.

Row format 1 (all integers big-endian):

    0x01 | state (1 byte: `_STATES` index) | updated_at (int64)
         | dispatch length (uint32) | answer length (uint32; 0: none) | followups (uint32)
         | dispatch | answer | followups, each: length (uint32) | bytes

Rows of journals written before it (until issue 18) are JSON, `{"state": ..., "dispatch":
<hex of the Avro>, ...}`: they start with `{` and are still read (`_decode_json`); the
next write of such an effect writes format 1. `torpor` reads the journal nowhere else.
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass
from typing import Final

from torpor.schemas.codec import decode_value, encode_value
from torpor.schemas.records import Dispatch, Input


class EffectState(enum.StrEnum):
    DISPATCHED = "dispatched"
    DONE = "done"
    DELIVERED = "delivered"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


FINISHED: Final = frozenset({EffectState.DONE, EffectState.DELIVERED, EffectState.CANCELLED})
# The state byte of a row: append only (rows on disk hold these indices).
_STATES: Final = (EffectState.DISPATCHED, EffectState.DONE, EffectState.DELIVERED, EffectState.CANCELLED,
                  EffectState.UNKNOWN)
_STATE_INDEX: Final = {state: index for index, state in enumerate(_STATES)}
_FORMAT_1: Final = 1
_HEADER: Final = struct.Struct(">BBqIII")
_LENGTH: Final = struct.Struct(">I")


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


@dataclass(frozen=True, slots=True)
class EncodedEffect:
    """`effect` and the single-object Avro bytes of its records (module docstring)."""

    effect: Effect
    dispatch: bytes
    answer: bytes | None
    followups: tuple[bytes, ...]

    def row(self) -> bytes:
        effect = self.effect
        header = _HEADER.pack(_FORMAT_1, _STATE_INDEX[effect.state], effect.updated_at, len(self.dispatch),
                              0 if self.answer is None else len(self.answer), len(self.followups))
        parts = [header, self.dispatch, self.answer or b""]
        for followup in self.followups:
            parts += (_LENGTH.pack(len(followup)), followup)
        return b"".join(parts)


def encoded(effect: Effect, like: EncodedEffect | None = None, answer: bytes | None = None) -> EncodedEffect:
    """`effect` with its records' bytes; those it shares with `like.effect` are not encoded
    again, nor its answer if the caller has its single-object encoding (`answer`)."""
    if answer is None and effect.answer is not None:
        if like is not None and like.effect.answer is effect.answer:
            answer = like.answer
        else:
            answer = encode_value(effect.answer)
    if like is None:
        return EncodedEffect(effect, encode_value(effect.dispatch), answer,
                             tuple(encode_value(f) for f in effect.followups))
    before = like.effect
    return EncodedEffect(
        effect,
        like.dispatch if before.dispatch is effect.dispatch else encode_value(effect.dispatch),
        answer,
        like.followups if before.followups is effect.followups else tuple(
            encode_value(f) for f in effect.followups))


def decode_row(raw: bytes) -> EncodedEffect:
    """The effect a journal row holds. Raises `ValueError` for a row in no known format
    (or cut short), `DecodeError` for records that do not decode."""
    if raw[:1] == b"{":
        return _decode_json(raw)
    if len(raw) < _HEADER.size or raw[0] != _FORMAT_1:
        raise ValueError(f"journal row in no known format ({len(raw)} bytes, first {raw[:1]!r})")
    _, state, updated_at, dispatch_length, answer_length, count = _HEADER.unpack_from(raw)
    at = _HEADER.size
    dispatch = raw[at:at + dispatch_length]
    at += dispatch_length
    answer = raw[at:at + answer_length] if answer_length else None
    at += answer_length
    followups: list[bytes] = []
    for _ in range(count):
        if at + _LENGTH.size > len(raw):
            break  # cut short: said below
        (length,) = _LENGTH.unpack_from(raw, at)
        followups.append(raw[at + _LENGTH.size:at + _LENGTH.size + length])
        at += _LENGTH.size + length
    if at != len(raw) or len(followups) != count or state >= len(_STATES):
        raise ValueError(f"journal row cut short or malformed ({len(raw)} bytes, {at} read)")
    effect = Effect(dispatch=decode_value(dispatch, Dispatch), state=_STATES[state], updated_at=updated_at,
                    answer=None if answer is None else decode_value(answer, Input),
                    followups=tuple(decode_value(f, Dispatch) for f in followups))
    return EncodedEffect(effect, dispatch, answer, tuple(followups))


def _decode_json(raw: bytes) -> EncodedEffect:
    """A row as journals wrote them before format 1: JSON around the hex of the records."""
    data = json.loads(raw)
    dispatch = bytes.fromhex(data["dispatch"])
    answer = None if data["answer"] is None else bytes.fromhex(data["answer"])
    followups = tuple(bytes.fromhex(f) for f in data.get("followups", ()))
    effect = Effect(dispatch=decode_value(dispatch, Dispatch), state=EffectState(data["state"]),
                    updated_at=int(data["updated_at"]),
                    answer=None if answer is None else decode_value(answer, Input),
                    followups=tuple(decode_value(f, Dispatch) for f in followups))
    return EncodedEffect(effect, dispatch, answer, followups)
