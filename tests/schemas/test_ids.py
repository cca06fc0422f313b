"""`derive_id`: the cross-language rule, pinned by test vectors."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torpor.schemas.ids import ID_LENGTH, derive_id

# Vectors for clients in other languages: (base, parts...) -> id.
VECTORS = [
    (("m1",), "tp_ff24df19ed651071598dfc4ca6635146"),
    (("m1", "request"), "tp_991a941e040dd092c533375265559d95"),
    (("ab", "c"), "tp_e633574587208282b207b009cd2b59e3"),
    (("a", "bc"), "tp_50d7d75b1119a86e6a56b98ccad0c9f7"),
    (("thread-1", "spawn", "call_7"), "tp_6e0ba1ccca3b35ccff1ad2693c3e8cb9"),
    (("ünï", "ç"), "tp_d8d319b7e22638b175736d0a8eee0c82"),
]


@pytest.mark.parametrize(("args", "expected"), VECTORS)
def test_derive_id_matches_the_published_vectors(args: tuple[str, ...], expected: str) -> None:
    assert derive_id(*args) == expected


def test_the_rule_is_the_documented_one() -> None:
    payload = b"torpor.id.v1" + b"".join(len(p).to_bytes(4, "big") + p for p in (b"m1", b"request"))
    assert derive_id("m1", "request") == "tp_" + hashlib.sha256(payload).hexdigest()[:32]


@given(st.lists(st.text(), min_size=1, max_size=4))
def test_ids_are_bounded_and_plain(parts: list[str]) -> None:
    derived = derive_id(*parts)
    assert len(derived) == ID_LENGTH == 35
    assert derived.startswith("tp_") and all(c in "0123456789abcdef" for c in derived[3:])


@given(st.lists(st.text(), min_size=1, max_size=4), st.lists(st.text(), min_size=1, max_size=4))
def test_different_part_lists_give_different_ids(a: list[str], b: list[str]) -> None:
    if a != b:
        assert derive_id(*a) != derive_id(*b)
