"""The store's key layout: length-prefixed, so thread `t1` never sees the rows of `t10`.

Every thread row starts with the thread's prefix, `len(thread)|thread`, where `len` is
the UTF-8 length of the thread id as 4 bytes big-endian. A prefix scan over `t1`'s
prefix (`00000002 't1'`) cannot match `t10` (`00000003 't10'`), which a plain
`thread|` scheme gets wrong as soon as an id contains the separator.

After the prefix comes one byte naming the kind of row, then the row's own key::

    len|thread|S                 the thread's state but its config and answered call ids (statecodec)
    len|thread|F                 the thread's config (canonical JSON), written when it changes
    len|thread|A                 the thread's answered call ids (a JSON array), written when
                                 a call is answered
    len|thread|H|seq(8 BE)       history entry `seq` (big-endian: scans come out in seq order)
    len|thread|M|message_id      message id seen (value: its senders' digests): a copy is a
                                 duplicate; kept when the thread is deleted
    len|thread|C                 the seq of the thread's latest SummaryEntry (8 BE)
    len|thread|D                 a deletion time, written by torpor-fold/2 only (one day of
                                 2026-12); never read since, dropped by the thread's next deletion

Rows that belong to no thread use the empty thread id, `00000000`, which no thread can
have (`Input.thread_id` is never empty):

    00000000|W|thread            index: the thread awaits a completion (value: the request)
    00000000|O|name              store metadata, written only by `Store.apply` and never
                                 to the changelog (the offsets the store has reached)

The changelog mirrors these keys one to one (except the `O` rows), so a compacted
changelog restores exactly this layout.
"""

from __future__ import annotations

import functools
import struct
from typing import Final

_LEN: Final = struct.Struct(">I")
_SEQ: Final = struct.Struct(">Q")

STATE: Final = b"S"
CONFIG: Final = b"F"
ANSWERED: Final = b"A"
HISTORY: Final = b"H"
SEEN: Final = b"M"
SUMMARY: Final = b"C"
DELETED: Final = b"D"
AWAITING_MODEL: Final = b"W"
META: Final = b"O"

GLOBAL_PREFIX: Final = _LEN.pack(0)

META_CHANGELOG_OFFSET: Final = b"changelog_offset"
META_INPUT_OFFSET: Final = b"input_offset"


@functools.lru_cache(maxsize=4096)  # several keys per input for the same thread; bounded, not per agent
def thread_prefix(thread_id: str) -> bytes:
    """`len(thread)|thread`: every row of `thread_id` starts with it, and no other row does."""
    if not thread_id:
        raise ValueError("a thread id is never empty (the empty id names store-global rows)")
    raw = thread_id.encode("utf-8")
    return _LEN.pack(len(raw)) + raw


def thread_prefix_of(key: bytes) -> bytes:
    """The `len|thread` prefix a thread row's key starts with."""
    return key[: _LEN.size + _LEN.unpack_from(key)[0]]


def thread_of_prefix(prefix: bytes) -> str:
    """The thread id a `thread_prefix` names."""
    return prefix[_LEN.size :].decode("utf-8")


def state_key(thread_id: str) -> bytes:
    return thread_prefix(thread_id) + STATE


def config_key(thread_id: str) -> bytes:
    return thread_prefix(thread_id) + CONFIG


def answered_key(thread_id: str) -> bytes:
    return thread_prefix(thread_id) + ANSWERED


def history_prefix(thread_id: str) -> bytes:
    """The prefix of all history rows of `thread_id`, which scan in seq order."""
    return thread_prefix(thread_id) + HISTORY


def history_key(thread_id: str, seq: int) -> bytes:
    return history_prefix(thread_id) + _SEQ.pack(seq)


def seen_key(thread_id: str, message_id: str) -> bytes:
    return thread_prefix(thread_id) + SEEN + message_id.encode("utf-8")


def summary_key(thread_id: str) -> bytes:
    return thread_prefix(thread_id) + SUMMARY


def awaiting_model_prefix() -> bytes:
    return GLOBAL_PREFIX + AWAITING_MODEL


def awaiting_model_key(thread_id: str) -> bytes:
    return awaiting_model_prefix() + thread_id.encode("utf-8")


def meta_key(name: bytes) -> bytes:
    return GLOBAL_PREFIX + META + name


def encode_seq(seq: int) -> bytes:
    return _SEQ.pack(seq)


def decode_seq(raw: bytes) -> int:
    value: int = _SEQ.unpack(raw)[0]
    return value


def seq_of_history_key(key: bytes) -> int:
    """The seq at the end of a history row's key."""
    return decode_seq(key[-_SEQ.size :])


def thread_of_awaiting_key(key: bytes) -> str:
    return key[len(awaiting_model_prefix()) :].decode("utf-8")


def is_meta_key(key: bytes) -> bool:
    """Store metadata rows stay local: they are never written to the changelog."""
    return key.startswith(GLOBAL_PREFIX + META)


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with `prefix` (None: no bound)."""
    raw = bytearray(prefix)
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return None
    raw[-1] += 1
    return bytes(raw)
