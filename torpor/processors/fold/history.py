"""The hash chain over a thread's history (pure; never transitions a thread).

Each appended entry advances the thread's head: `head' = sha256(head || canonical_bytes(entry))`,
with the head as its 32 raw bytes and the result as hex, where `canonical_bytes` is the
schemaless Avro encoding of the entry under `schemas/HistoryEntry.avsc`
(`torpor.schemas.codec`). An empty history's head is `GENESIS_HEAD`. Replaying a
thread's inputs must end on the same head; a different head is a bug.

The model-visible history (read by the shell, never by the fold) is: the latest
`SummaryEntry`, then every non-summary entry whose `seq >= summary.up_to_seq`. With no
summary it is the whole history.

`note_call_ids` lists the call ids a history's entries mention, for the model stage's check
of a provider's ids (`models.callids`) and the history cache that keeps them per thread
(`store.tables.HistoryCache`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from torpor.processors.fold.state import GENESIS_HEAD
from torpor.schemas.codec import canonical_bytes
from torpor.schemas.records import AssistantEntry, EventEntry, HistoryEntry, ToolResultEntry


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


def note_call_ids(entries: Sequence[HistoryEntry], first: int, into: dict[str, int]) -> None:
    """Record in `into` every call id `entries` mention (an assistant's calls, a result's or an
    event's call), each with the index in the history of the first entry that mentions it;
    `entries[0]` is at index `first`. Entries are recorded in order, so an id keeps its first index."""
    # Plain loops, no generator per entry (as Python, one cost four times this).
    index = first
    for entry in entries:
        body = entry.body
        if isinstance(body, AssistantEntry):
            for call in body.tool_calls:
                if call.call_id not in into:
                    into[call.call_id] = index
        elif isinstance(body, (ToolResultEntry, EventEntry)) and body.call_id not in into:
            into[body.call_id] = index
        index += 1
