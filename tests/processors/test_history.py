"""The hash chain over history entries."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from torpor.processors.fold.history import advance, advance_bytes, advance_link, chain
from torpor.processors.fold.state import GENESIS_HEAD
from torpor.schemas.codec import canonical_bytes
from torpor.schemas.records import HistoryEntry, TextBlock, UserEntry


def entry(seq: int, text: str) -> HistoryEntry:
    return HistoryEntry(
        seq=seq,
        created_at=1000 + seq,
        input_id=f"m{seq}",
        body=UserEntry(content=(TextBlock(text),), interrupt=False),
    )


def test_the_head_is_sha256_of_the_previous_head_and_the_canonical_bytes() -> None:
    first = entry(0, "hello")
    expected = hashlib.sha256(bytes(32) + canonical_bytes(first)).hexdigest()
    assert advance(GENESIS_HEAD, first) == expected
    assert chain((first,)) == expected


def test_an_empty_history_has_the_genesis_head() -> None:
    assert chain(()) == GENESIS_HEAD == "0" * 64


def test_the_chain_depends_on_every_entry_and_their_order() -> None:
    a, b = entry(0, "a"), entry(1, "b")
    assert chain((a, b)) != chain((b, a))
    assert chain((a, b)) != chain((a, entry(1, "c")))
    assert chain((a, b)) == advance(advance(GENESIS_HEAD, a), b)


@given(st.lists(st.binary(max_size=64), max_size=12), st.sampled_from([GENESIS_HEAD, "ab" * 32]))
def test_a_run_chained_on_raw_links_ends_on_the_head_chained_on_hex(
    canonicals: list[bytes], head: str
) -> None:
    link = bytes.fromhex(head)
    for canonical in canonicals:
        head = advance_bytes(head, canonical)
        link = advance_link(link, canonical)
        assert link.hex() == head
