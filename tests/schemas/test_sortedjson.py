"""`torpor.schemas.sortedjson`: exactly what `JSONEncoder(sort_keys=True, ...).encode` writes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torpor.schemas.sortedjson import sorted_json

_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@pytest.mark.parametrize("ensure_ascii", [True, False])
@settings(max_examples=200, deadline=None)
@given(value=_VALUES)
def test_the_text_is_the_reference_encoders(ensure_ascii: bool, value: object) -> None:
    reference = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=ensure_ascii).encode
    assert sorted_json(ensure_ascii)(value) == reference(value)


def test_errors_are_the_reference_encoders_and_leave_no_trace() -> None:
    encode = sorted_json(ensure_ascii=True)
    looped: list[object] = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular reference"):
        encode(looped)
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode({"a": object()})
    with pytest.raises(TypeError):
        encode({"a": 1, 2: 3})  # keys of two types cannot be sorted
    shared = ["x"]
    assert encode({"b": shared, "a": shared}) == '{"a":["x"],"b":["x"]}'  # not a cycle
