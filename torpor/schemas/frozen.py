"""A faster `__init__` for frozen, slotted dataclasses, same signature, same result.

Why: the fold builds several frozen records per input (entries, events, effects, the
receipt), and the `__init__` that `dataclasses` writes for a frozen class sets each field
through `object.__setattr__` (it must step around the class's own `__setattr__`, which
refuses). That generic call cost about five times a plain slot store: dataclass
`__init__` was the largest self time of the local benchmark (py-spy, issue 18).

`fast_inits(module_name)` replaces, for every frozen `slots=True` dataclass defined in
that module, the generated `__init__` with one that stores each argument through its
slot's own descriptor (`member_descriptor.__set__`, what `object.__setattr__` ends in
for a slot). Same parameters, same defaults (keyword-only included), `__post_init__`
still called last; the class stays frozen (its `__setattr__` still refuses) and
`dataclasses.replace`, `==`, `hash` and pickling are untouched. A class that uses
`default_factory`, `init=False` fields or `InitVar` keeps its generated `__init__`
(none of the records needs those). `original_init(cls)` returns the replaced one, for
the test that checks the two agree.

A frozen class of a compiled module may write its own `__init__` of plain attribute stores
(`init=False`; `torpor.processors.fold.effects` says why). Compiled, that class is native
(its attributes are not slots) and is left alone; run as Python, those stores would meet
the frozen `__setattr__`, so its `__init__` is replaced like a generated one. It must take
exactly the fields, with the fields' defaults: `fast_inits` raises `TypeError` otherwise,
at import, rather than build a different record.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
from collections.abc import Callable
from typing import Final, TypeVar

T = TypeVar("T")
_ORIGINAL: Final[dict[type, Callable[..., None]]] = {}


def fast_inits(module_name: str) -> tuple[type, ...]:
    """Give each frozen slotted dataclass defined in `module_name` the faster `__init__`;
    return the classes changed. Call it at the end of the module, once its classes exist."""
    changed = []
    for value in list(vars(sys.modules[module_name]).values()):
        if isinstance(value, type) and value.__module__ == module_name and _is_eligible(value):
            _install(value)
            changed.append(value)
    return tuple(changed)


def original_init(cls: type) -> Callable[..., None]:
    """The `__init__` that `dataclasses` generated for `cls` (KeyError if it was not replaced)."""
    return _ORIGINAL[cls]


def _is_eligible(cls: type) -> bool:
    if cls in _ORIGINAL or not dataclasses.is_dataclass(cls):
        return False
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        return False
    fields = dataclasses.fields(cls)
    if not all(isinstance(cls.__dict__.get(f.name), types.MemberDescriptorType) for f in fields):
        return False  # not slots: a native class of a compiled module, whose own __init__ stays
    # An `InitVar` or an `init=False` field would make the parameters differ from the fields.
    signature = inspect.signature(cls.__dict__["__init__"])
    same = list(signature.parameters)[1:] == [f.name for f in fields] and all(
        f.init and f.default_factory is dataclasses.MISSING for f in fields)
    if params.init:
        return same
    # An `__init__` written for the compiled build (module docstring): it cannot run here.
    if not same:
        raise TypeError(f"{cls.__name__}.__init__ must take exactly its fields, none with a factory")
    for f in fields:
        default = signature.parameters[f.name].default
        wanted = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        if default is not wanted and default != wanted:
            raise TypeError(f"{cls.__name__}.__init__: the default of {f.name} is not the field's")
    return True


def _install(cls: type) -> None:
    fields = dataclasses.fields(cls)
    namespace: dict[str, object] = {}
    positional: list[str] = []
    keyword_only: list[str] = []
    body: list[str] = []
    for index, f in enumerate(fields):
        setter, default = f"_set{index}", f"_default{index}"
        namespace[setter] = cls.__dict__[f.name].__set__
        param = f.name
        if f.default is not dataclasses.MISSING:
            namespace[default] = f.default
            param = f"{f.name}={default}"
        (keyword_only if f.kw_only else positional).append(param)
        body.append(f"    {setter}(self, {f.name})")
    params = ", ".join(["self", *positional, *(["*", *keyword_only] if keyword_only else [])])
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__({params}) -> None:\n" + ("\n".join(body) or "    pass") + "\n"
    exec(source, namespace)  # source built from field names only, once per class
    init = namespace["__init__"]
    assert isinstance(init, types.FunctionType)
    original = cls.__dict__["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = original.__doc__
    init.__annotations__ = dict(original.__annotations__)
    _ORIGINAL[cls] = original
    type.__setattr__(cls, "__init__", init)
