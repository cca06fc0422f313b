"""Dataclass <-> Avro datum conversion, planned once per class from its type hints.

`plan_for(cls)` returns a `RecordPlan` whose `to_avro` turns a record of `cls` into the
datum fastavro writes, and whose `from_avro` turns the datum fastavro reads back into
`cls`. The mapping is the one `records.py` states: `str`, `int`, `bool`, `bytes`,
`float` pass through; `tuple[X, ...]` is an array; `X | None` is ``["null", X]``; a
union of two or more record classes is written in fastavro's tuple notation
``(fullname, datum)`` so the branch is chosen by name, never guessed from the fields
(`TextBlock` and `ThinkingBlock` both have `text`), and is read back with
``return_record_name=True`` (a lone record beside null stays a plain dict, as
``return_record_name_override=True`` reads it).

Plans are cached per class: a processor decodes thousands of records a second and must
not re-inspect type hints for each. Each plan's two functions are generated source, one
straight-line expression per field (as `dataclasses` generates `__init__`), because that
is several times faster than walking field descriptors and closures per value.
`plan_for` raises `TypeError` for a class or a field type outside the mapping: a bug in
`records.py`, found on first use, never a decode-time condition. The generated functions
raise `KeyError` or `TypeError` for a value outside the class's types (a record that is
not a branch of its union); the codec turns that into `ContractError` or `DecodeError`.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

NAMESPACE: Final = "torpor"

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


def _is_record(tp: object) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


class _Source:
    """Names bound into the generated source, and fresh local names for it."""

    def __init__(self, cls: type) -> None:
        self.namespace: dict[str, object] = {"_cls": cls}
        self._ids = itertools.count()

    def bind(self, value: object) -> str:
        name = f"_b{next(self._ids)}"
        self.namespace[name] = value
        return name

    def local(self) -> str:
        return f"_v{next(self._ids)}"


def _exprs(tp: object, to_src: str, from_src: str, src: _Source, where: str) -> tuple[str, str]:
    """Expressions converting `to_src` (a Python value) and `from_src` (a datum) of type `tp`."""
    if tp in _SCALARS:
        return to_src, from_src
    if _is_record(tp):
        plan = plan_for(typing.cast(type, tp))
        return f"{src.bind(plan.to_avro)}({to_src})", f"{src.bind(plan.from_avro)}({from_src})"
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"{where}: only tuple[X, ...] maps to an Avro array, not {tp!r}")
        item = src.local()
        to_item, from_item = _exprs(args[0], item, item, src, where)
        # fastavro writes any sequence as an array, so a tuple of scalars passes as is.
        to_expr = to_src if to_item == item else f"[{to_item} for {item} in {to_src}]"
        from_expr = (
            f"tuple({from_src})" if from_item == item else f"tuple([{from_item} for {item} in {from_src}])"
        )
        return to_expr, from_expr
    if _is_union(tp):
        args = typing.get_args(tp)
        members = tuple(a for a in args if a is not type(None))
        if len(members) < len(args):
            value = src.local()
            inner_to, inner_from = _exprs(_union_of(members), value, value, src, where)
            if inner_to == value and inner_from == value:
                return to_src, from_src
            return (
                f"(None if ({value} := {to_src}) is None else {inner_to})",
                f"(None if ({value} := {from_src}) is None else {inner_from})",
            )
        return _record_union(members, to_src, from_src, src, where)
    raise TypeError(f"{where}: no Avro mapping for {tp!r}")


def _union_of(members: tuple[object, ...]) -> object:
    if len(members) == 1:
        return members[0]
    return typing.Union[members]  # noqa: UP007 - built from a runtime tuple of members


def _record_union(
    members: tuple[object, ...], to_src: str, from_src: str, src: _Source, where: str
) -> tuple[str, str]:
    plans = []
    for member in members:
        if not _is_record(member):
            raise TypeError(f"{where}: a union may hold only record classes (and None), not {member!r}")
        plans.append(plan_for(typing.cast(type, member)))
    by_type = {p.cls: _tagged(p) for p in plans}
    by_name = {p.fullname: p.from_avro for p in plans}
    value = src.local()
    return (
        f"{src.bind(by_type)}[type({value} := {to_src})]({value})",
        f"{src.bind(by_name)}[({value} := {from_src})[0]]({value}[1])",
    )


def _tagged(plan: RecordPlan) -> Callable[[object], tuple[str, dict[str, object]]]:
    name, to_avro = plan.fullname, plan.to_avro

    def tag(value: object) -> tuple[str, dict[str, object]]:
        return (name, to_avro(value))

    return tag


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
    if not _is_record(cls):
        raise TypeError(f"{cls!r} is not a record class")
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    src = _Source(cls)
    to_items: list[str] = []
    from_args: list[str] = []
    for field in dataclasses.fields(cls):
        to_expr, from_expr = _exprs(
            hints[field.name], f"r.{field.name}", f"d[{field.name!r}]", src, f"{cls.__name__}.{field.name}"
        )
        to_items.append(f"{field.name!r}: {to_expr}")
        from_args.append(from_expr)
    # Field names are identifiers checked by `dataclasses` and every other name is bound
    # by `_Source`, so nothing from outside the class definition reaches the source.
    source = (
        f"def to_avro(r):\n    return {{{', '.join(to_items)}}}\n"
        f"def from_avro(d):\n    return _cls({', '.join(from_args)})\n"
    )
    exec(compile(source, f"<torpor plan {cls.__name__}>", "exec"), src.namespace)
    return RecordPlan(
        cls=cls,
        fullname=fullname(cls),
        to_avro=typing.cast(Callable[[object], dict[str, object]], src.namespace["to_avro"]),
        from_avro=typing.cast(Callable[[dict[str, object]], object], src.namespace["from_avro"]),
    )
