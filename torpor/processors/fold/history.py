"""The hash chain over a thread's history (pure; never transitions a thread).

Each appended entry advances the thread's head: `head' = sha256(head || canonical_bytes(entry))`,
with the head as its 32 raw bytes and the result as hex, where `canonical_bytes` is the
schemaless Avro encoding of the entry under `schemas/HistoryEntry.avsc`
(`torpor.schemas.codec`). An empty history's head is `GENESIS_HEAD`. Replaying a
thread's inputs must end on the same head; a different head is a bug.

The model-visible history (read by the shell, never by the fold) is: the latest
`SummaryEntry`, then every non-summary entry whose `seq >= summary.up_to_seq`. With no
summary it is the whole history.
"""

from __future__ import annotations

import hashlib

from torpor.processors.fold.state import GENESIS_HEAD
from torpor.schemas.codec import canonical_bytes
from torpor.schemas.records import HistoryEntry


def advance(head: str, entry: HistoryEntry) -> str:
    """The head after appending `entry` to a history whose head is `head`."""
    return advance_bytes(head, canonical_bytes(entry))


def advance_bytes(head: str, canonical: bytes) -> str:
    """`advance` for an entry whose `canonical_bytes` are `canonical` (encoded once, by the caller)."""
    return hashlib.sha256(bytes.fromhex(head) + canonical).hexdigest()


def advance_link(link: bytes, canonical: bytes) -> bytes:
    """`advance_bytes` with the head as its 32 raw bytes, before and after (`bytes.hex()` is
    the head): for a reader that chains many entries in a row, converting only at the ends."""
    return hashlib.sha256(link + canonical).digest()


def chain(entries: tuple[HistoryEntry, ...], head: str = GENESIS_HEAD) -> str:
    """The head after appending `entries` in order (for audits and tests)."""
    for entry in entries:
        head = advance(head, entry)
    return head
