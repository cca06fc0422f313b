"""Dataclass <-> Avro datum conversion, planned once per class from its type hints.

`plan_for(cls)` returns a `RecordPlan` whose `to_avro` turns a record of `cls` into the
datum fastavro writes, and whose `from_avro` turns the datum fastavro reads back into
`cls`. The mapping is the one `records.py` states: `str`, `int`, `bool`, `bytes`,
`float` pass through; `tuple[X, ...]` is an array; `X | None` is ``["null", X]``; a
union of two or more record classes is written in fastavro's tuple notation
``(fullname, datum)`` so the branch is chosen by name, never guessed from the fields
(`TextBlock` and `ThinkingBlock` both have `text`), and is read back with
``return_record_name=True``.

Plans are cached per class: a processor decodes thousands of records a second
and must not re-inspect type hints for each. The two functions of a plan are generated
source (as `dataclasses` itself does), because a straight-line function is several
times faster than a loop over field descriptors. `plan_for` raises `TypeError` for a
class or a field type outside the mapping; that is a bug in `records.py`, found on the
first use, not a decode-time condition.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

NAMESPACE: Final = "torpor"

Convert = Callable[[object], object]
_SCALARS: Final = (str, int, bool, bytes, float)


@dataclass(frozen=True, slots=True)
class RecordPlan:
    """How one record class maps to and from its Avro datum (a dict)."""

    cls: type
    fullname: str
    to_avro: Callable[[object], dict[str, object]]
    from_avro: Callable[[dict[str, object]], object]


def fullname(cls: type) -> str:
    """The Avro full name of record class `cls`: ``torpor.<ClassName>``."""
    return f"{NAMESPACE}.{cls.__name__}"


def _is_union(tp: object) -> bool:
    return isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union


def _converter(tp: object, where: str) -> tuple[Convert | None, Convert | None]:
    """(to_avro, from_avro) for a field type; None means the value passes unchanged."""
    if tp in _SCALARS:
        return None, None
    if _is_union(tp):
        args = typing.get_args(tp)
        non_null = tuple(a for a in args if a is not type(None))
        if len(non_null) < len(args):
            if len(non_null) == 1:
                return _optional(*_converter(non_null[0], where))
            inner_to, inner_from = _record_union(non_null, where)
            return _optional(inner_to, inner_from)
        return _record_union(non_null, where)
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"{where}: only tuple[X, ...] maps to an Avro array, not {tp!r}")
        return _array(*_converter(args[0], where))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        plan = plan_for(tp)
        return plan.to_avro, _from_dict(plan.from_avro)
    raise TypeError(f"{where}: no Avro mapping for {tp!r}")


def _from_dict(read: Callable[[dict[str, object]], object]) -> Convert:
    def convert(datum: object) -> object:
        assert isinstance(datum, dict)
        return read(datum)

    return convert


def _optional(to: Convert | None, frm: Convert | None) -> tuple[Convert | None, Convert | None]:
    def opt_to(value: object) -> object:
        return None if value is None else to(value)  # type: ignore[misc]

    def opt_from(datum: object) -> object:
        return None if datum is None else frm(datum)  # type: ignore[misc]

    return (None if to is None else opt_to), (None if frm is None else opt_from)


def _array(to: Convert | None, frm: Convert | None) -> tuple[Convert | None, Convert | None]:
    def arr_to(value: object) -> object:
        assert isinstance(value, tuple)
        return [to(v) for v in value] if to is not None else value

    def arr_from(datum: object) -> object:
        assert isinstance(datum, list)
        return tuple(datum) if frm is None else tuple([frm(d) for d in datum])

    return arr_to, arr_from


def _record_union(members: tuple[object, ...], where: str) -> tuple[Convert, Convert]:
    plans: list[RecordPlan] = []
    for member in members:
        if not (isinstance(member, type) and dataclasses.is_dataclass(member)):
            raise TypeError(f"{where}: a union may hold only record classes (and None), not {member!r}")
        plans.append(plan_for(member))
    if len(plans) == 1:
        # A lone record beside null: fastavro writes and reads it as a plain dict
        # (return_record_name_override), so no tuple notation is needed.
        only = plans[0]
        return only.to_avro, _from_dict(only.from_avro)
    by_type = {p.cls: (p.fullname, p.to_avro) for p in plans}
    by_name = {p.fullname: p.from_avro for p in plans}

    def union_to(value: object) -> object:
        try:
            name, to = by_type[type(value)]
        except KeyError:
            raise TypeError(f"{where}: {type(value).__name__} is not a branch of this union") from None
        return (name, to(value))

    def union_from(datum: object) -> object:
        assert isinstance(datum, tuple)
        name, inner = datum
        try:
            frm = by_name[name]
        except KeyError:
            raise ValueError(f"{where}: union branch {name!r} is not known to this reader") from None
        return frm(inner)

    return union_to, union_from


_PLANS: dict[type, RecordPlan] = {}


def plan_for(cls: type) -> RecordPlan:
    """The cached conversion plan for record class `cls` (a dataclass from `records.py`).

    Raises `TypeError` if `cls` is not a dataclass or a field type has no Avro mapping.
    """
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _build_plan(cls)
        # A race builds an equal plan twice; keeping either is harmless.
        _PLANS[cls] = plan
    return plan


def _build_plan(cls: type) -> RecordPlan:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a record class")
    module = sys.modules[cls.__module__]
    hints = typing.get_type_hints(cls, vars(module))
    names: list[str] = []
    namespace: dict[str, object] = {"_cls": cls}
    to_items: list[str] = []
    from_args: list[str] = []
    for index, field in enumerate(dataclasses.fields(cls)):
        to, frm = _converter(hints[field.name], f"{cls.__name__}.{field.name}")
        names.append(field.name)
        attr = f"r.{field.name}"
        item = f"d[{field.name!r}]"
        if to is not None:
            namespace[f"_to{index}"] = to
            attr = f"_to{index}({attr})"
        if frm is not None:
            namespace[f"_from{index}"] = frm
            item = f"_from{index}({item})"
        to_items.append(f"{field.name!r}: {attr}")
        from_args.append(item)
    # Field names are Python identifiers checked by `dataclasses`, so the generated source
    # cannot be injected into; the functions are straight-line for speed.
    source = (
        f"def to_avro(r):\n    return {{{', '.join(to_items)}}}\n"
        f"def from_avro(d):\n    return _cls({', '.join(from_args)})\n"
    )
    exec(compile(source, f"<torpor plan {cls.__name__}>", "exec"), namespace)
    return RecordPlan(
        cls=cls,
        fullname=fullname(cls),
        to_avro=typing.cast(Callable[[object], dict[str, object]], namespace["to_avro"]),
        from_avro=typing.cast(Callable[[dict[str, object]], object], namespace["from_avro"]),
    )
