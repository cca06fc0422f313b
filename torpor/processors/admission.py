"""What a runtime lets in before `step`: one record's bytes decoded into an `Input`, or
the reason it is parked unfolded. The processor and a replay both ask `admit`, so a
replay skips exactly what the live processor parked.

A record is parked when its value is null or not an `Input` (undecodable), or when it is
too large (`size_problem`): over `MAX_INPUT_BYTES_CEILING` it is never decoded (a huge
input would cost its size in memory at every replay, and in every completion request
that carried it); over `TORPOR_MAX_INPUT_BYTES` only the processor's own inputs pass,
bounded at the ceiling by construction (`step`); a forged one is refused by the verifier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from torpor.processors.fold.verify import PROCESSOR_SOURCE
from torpor.schemas.codec import Codec
from torpor.schemas.errors import DecodeError
from torpor.schemas.records import Input
from torpor.streams.config import MAX_INPUT_BYTES_CEILING

UNDECODABLE: Final = "undecodable"
OVERSIZED: Final = "oversized"


@dataclass(frozen=True, slots=True)
class Refused:
    """A record parked unfolded: `what` it was (`UNDECODABLE`, `OVERSIZED`) and why."""

    what: str
    error: DecodeError


def size_problem(size: int, limit: int, source: str | None) -> str | None:
    """Why an encoded input of `size` bytes is parked unfolded, or None (module docstring).
    `limit` is `TORPOR_MAX_INPUT_BYTES`; `source` None means not decoded yet: only the
    ceiling applies."""
    if size > MAX_INPUT_BYTES_CEILING:
        return f"oversized: {size} bytes, more than the {MAX_INPUT_BYTES_CEILING} any input may have"
    if source is not None and source != PROCESSOR_SOURCE and size > limit:
        return f"oversized: {size} bytes, more than the {limit} of TORPOR_MAX_INPUT_BYTES"
    return None


def admit(codec: Codec, topic: str, value: bytes | None, partition: int, offset: int,
          limit: int) -> Input | Refused:
    """The `Input` in `value`, or why it is parked (module docstring)."""
    size = len(value or b"")
    problem = size_problem(size, limit, None)  # before decoding, and after
    if problem is None:
        try:
            if value is None:
                raise DecodeError("a null value is not an Input", topic=topic, partition=partition,
                                  offset=offset)
            decoded = codec.decode(topic, value, Input, partition=partition, offset=offset)
        except DecodeError as error:
            return Refused(UNDECODABLE, error)
        problem = size_problem(size, limit, decoded.source)
        if problem is None:
            return decoded
    return Refused(OVERSIZED, DecodeError(problem, topic=topic, partition=partition, offset=offset))
