"""Hypothesis strategies for every record class of `torpor.schemas.records`.

`records(cls)` builds any record class from its type hints, with values that fit its
Avro schema (strings without surrogates, longs in the signed 64-bit range, finite
doubles, short arrays so nested records stay small). The named strategies below are the
ones other tests usually want; pass your own strategy for a field through `records`'s
keyword overrides, e.g. ``records(Input, body=user_messages())``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Final, TypeVar

from hypothesis import strategies as st

from torpor.schemas import records as r

T = TypeVar("T")

LONG_MIN: Final = -(2**63)
LONG_MAX: Final = 2**63 - 1
MAX_ARRAY: Final = 3

ids: Final = st.text(min_size=1, max_size=24)
"""A plausible wire id (any non-empty text)."""

times: Final = st.integers(min_value=0, max_value=4_102_444_800_000)
"""Milliseconds since the epoch, 1970 to 2100."""

_TIME_FIELDS: Final = frozenset({"created_at", "expires_at", "due_at", "deadline"})


def _for_type(tp: object, field_name: str) -> st.SearchStrategy[object]:
    if tp is str:
        return st.text(max_size=40)
    if tp is bool:
        return st.booleans()
    if tp is bytes:
        return st.binary(max_size=40)
    if tp is float:
        return st.floats(allow_nan=False)
    if tp is int:
        return times if field_name in _TIME_FIELDS else st.integers(LONG_MIN, LONG_MAX)
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return st.one_of([_for_type(a, field_name) for a in typing.get_args(tp)])
    if tp is type(None):
        return st.none()
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        return st.lists(_for_type(item, field_name), max_size=MAX_ARRAY).map(tuple)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return st.deferred(lambda: records(tp))
    raise TypeError(f"no strategy for {tp!r} ({field_name})")


def records(cls: type[T], **overrides: st.SearchStrategy[object]) -> st.SearchStrategy[T]:
    """Records of class `cls`, every field drawn from its type (or from `overrides`)."""
    hints = typing.get_type_hints(cls, vars(r))
    fields = {
        f.name: overrides.get(f.name, _for_type(hints[f.name], f.name))
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
    }
    return st.builds(cls, **fields)


def user_messages() -> st.SearchStrategy[r.UserMessage]:
    """`UserMessage` bodies with text and image blocks."""
    return records(r.UserMessage)


def input_bodies() -> st.SearchStrategy[r.InputBody]:
    """Any input body, every branch of the union."""
    return st.one_of([records(c) for c in typing.get_args(r.InputBody)])


def inputs(body: st.SearchStrategy[object] | None = None) -> st.SearchStrategy[r.Input]:
    """`Input` envelopes, with any body or bodies drawn from `body`."""
    return records(r.Input, message_id=ids, thread_id=ids, body=body if body is not None else input_bodies())


def history_entries() -> st.SearchStrategy[r.HistoryEntry]:
    """History entries of every body kind."""
    return records(r.HistoryEntry, seq=st.integers(0, 2**31))


def dispatches() -> st.SearchStrategy[r.Dispatch]:
    """Outbox `Dispatch` records."""
    return records(r.Dispatch)


def thread_events() -> st.SearchStrategy[r.ThreadEvent]:
    """`ThreadEvent` records, with or without a history entry."""
    return records(r.ThreadEvent)


def receipts() -> st.SearchStrategy[r.Receipt]:
    """`Receipt` records."""
    return records(r.Receipt)


TOP_LEVEL: Final[dict[type, st.SearchStrategy[object]]] = {
    r.Input: inputs(),
    r.Dispatch: dispatches(),
    r.ThreadEvent: thread_events(),
    r.Receipt: receipts(),
    r.HistoryEntry: history_entries(),
}
"""One strategy per top-level record class (each has its own `.avsc` file)."""
