"""JSON Schema keywords for untrusted schemas and values: RE2 regexes, linear time, metered.

Contract. `validator_class(draft)` is a `jsonschema` validator class for draft-04, -06 or
-07 whose keywords cannot be made to run for long by what a schema or a value says:

- `pattern`, `patternProperties`, `additionalProperties` (which matches property names
  against the `patternProperties`) and `format: regex` use RE2 (`re2`), whose matching
  is linear in the text: no catastrophic backtracking (`^(a+)+$` on `aaaa...!`), and no
  backreferences or lookaround, which `regex_problem` reports so a schema that uses them
  is refused when it is registered. RE2 semantics differ from Python's `re` in corners
  (`\\d` and `\\w` are ASCII, `$` matches only at the very end).
- `uniqueItems` hashes canonical keys (linear) instead of `jsonschema`'s pairwise
  comparison, which is quadratic for arrays of objects.
- `format` checks the formats fastjsonschema (the validator Torpor used before) checked
  by default for the draft, with its expressions rewritten for RE2: the same
  acceptance, so a replay of an old log judges old values the same way.
- Every keyword is metered: `metered(...)` counts keyword evaluations and their nesting
  and raises `ValidationBudgetExceeded` past `MAX_STEPS` or `MAX_NESTING`. The count is
  a function of the schema and the value alone (never of a clock or of the caller's
  stack), so a replay judges a value exactly as the live run did, and a schema that
  fans out exponentially (`allOf` of two `$ref`s to itself) or loops (`{"$ref": "#"}`)
  stops after bounded work instead of for hours or at a `RecursionError`.

Nothing here does I/O; the validators are built by `torpor.schemas.jsontext` with an
empty `referencing.Registry`, so no `$ref` is ever retrieved.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final, Protocol

import jsonschema
import re2
from jsonschema import Draft4Validator, Draft6Validator, Draft7Validator, FormatChecker, ValidationError
from jsonschema.protocols import Validator as ValidatorProtocol

MAX_STEPS: Final = 50_000
"""Keyword evaluations per validation. A tool's arguments or result need a few per value
node; 50,000 take about 0.3 s at worst (a 2024 laptop core), which caps what one hostile schema
can cost the partition's fold thread (a thread's schemas are only checked as the fold runs)."""

MAX_NESTING: Final = 128
"""Keywords applied inside one another (`properties` > `$ref` > `items` > ...). Two per level
covers a 64-level value; each costs about three Python frames, so validation stays far below
the interpreter's recursion limit wherever the fold is called from."""

_RE2_OPTIONS: Final = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is reported as a schema problem, not on stderr


class ValidationBudgetExceeded(Exception):
    """Validating one value needed more than `MAX_STEPS` keyword evaluations or `MAX_NESTING` nesting."""


class _Program(Protocol):
    def search(self, text: str) -> object: ...


class _Validator(Protocol):
    """What a keyword needs of the `jsonschema` validator it runs in."""

    def descend(self, instance: object, schema: object, path: str | None = None,
                schema_path: str | None = None) -> Iterator[ValidationError]: ...


@functools.lru_cache(maxsize=1024)
def compiled_regex(pattern: str) -> _Program:
    """The RE2 program for `pattern`; raises `re2.error` if RE2 cannot compile it."""
    program: _Program = re2.compile(pattern, options=_RE2_OPTIONS)
    return program


def regex_problem(pattern: str) -> str | None:
    """Why RE2 cannot compile `pattern` (backreferences, lookaround, too large), or None."""
    try:
        compiled_regex(pattern)
    except re2.error as error:
        reason = error.args[0] if error.args else error
        return reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
    return None


def _search(pattern: str, text: str) -> bool:
    return compiled_regex(pattern).search(text) is not None


# --- the meter ------------------------------------------------------------------------


@dataclass(slots=True)
class _Meter:
    steps: int = 0
    nesting: int = 0


_METER: ContextVar[_Meter | None] = ContextVar("torpor_schema_meter", default=None)


class _Metered:
    """The block of `metered()`. A class, not a `contextlib` generator: it is entered once per
    validated value, on the fold's path (a tool call's arguments), where the generator's
    machinery cost about 2 us of a 20 us validation."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _METER.set(_Meter())

    def __exit__(self, *_: object) -> None:
        _METER.reset(self._token)


def metered() -> _Metered:
    """Count the keywords evaluated inside the block (see the module docstring)."""
    return _Metered()


Keyword = Callable[[_Validator, object, object, dict[str, object]], Iterable[ValidationError] | None]


def _counted(keyword: Keyword) -> Keyword:
    def counted(validator: _Validator, value: object, instance: object, schema: dict[str, object],
                ) -> Iterator[ValidationError]:
        meter = _METER.get()
        if meter is None:  # outside `metered()`: only the trusted metaschema check runs here
            yield from keyword(validator, value, instance, schema) or ()
            return
        meter.steps += 1
        if meter.steps > MAX_STEPS:
            raise ValidationBudgetExceeded(f"validation needs more than {MAX_STEPS} steps")
        if meter.nesting >= MAX_NESTING:
            raise ValidationBudgetExceeded(f"the schema applies keywords nested deeper than {MAX_NESTING}")
        meter.nesting += 1
        try:
            yield from keyword(validator, value, instance, schema) or ()
        finally:
            meter.nesting -= 1

    return counted


def _charge(searches: int) -> None:
    """Count `searches` regex searches against the budget, one step each: a keyword that
    matches every property name against every pattern costs their product, not one step."""
    meter = _METER.get()
    if meter is None:
        return
    meter.steps += searches
    if meter.steps > MAX_STEPS:
        raise ValidationBudgetExceeded(f"validation needs more than {MAX_STEPS} steps")


# --- keywords rewritten for RE2 and linear time ----------------------------------------


def _pattern(validator: _Validator, pattern: object, instance: object, schema: dict[str, object],
             ) -> Iterator[ValidationError]:
    if isinstance(instance, str) and isinstance(pattern, str) and not _search(pattern, instance):
        yield ValidationError(f"{_short(instance)} does not match {pattern!r}")


def _pattern_properties(validator: _Validator, patterns: object, instance: object,
                        schema: dict[str, object]) -> Iterator[ValidationError]:
    if not isinstance(instance, dict) or not isinstance(patterns, dict):
        return
    _charge(len(patterns) * len(instance))
    for pattern, subschema in patterns.items():
        for name, value in instance.items():
            if _search(pattern, name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(validator: _Validator, extra: object, instance: object,
                           schema: dict[str, object]) -> Iterator[ValidationError]:
    if not isinstance(instance, dict):
        return
    known = schema.get("properties")
    known = known if isinstance(known, dict) else {}
    declared = schema.get("patternProperties")
    patterns = tuple(declared) if isinstance(declared, dict) else ()
    _charge(len(patterns) * len(instance))
    extras = [name for name in instance
              if name not in known and not any(_search(p, name) for p in patterns)]
    if isinstance(extra, dict):
        for name in extras:
            yield from validator.descend(instance[name], extra, path=name)
    elif extra is False and extras:
        listed = ", ".join(repr(name) for name in sorted(extras))
        shown = listed if len(listed) <= 200 else f"{listed[:200]}..."
        yield ValidationError(f"Additional properties are not allowed ({shown} unexpected)")


def _unique_items(validator: _Validator, unique: object, instance: object, schema: dict[str, object],
                  ) -> Iterator[ValidationError]:
    if not unique or not isinstance(instance, list):
        return
    seen: set[object] = set()
    for item in instance:
        key = _canonical(item)
        if key in seen:
            yield ValidationError(f"{_short(instance)} has non-unique elements")
            return
        seen.add(key)


def _canonical(value: object) -> object:
    """A hashable key equal exactly when two JSON values are equal in JSON Schema's sense
    (1 == 1.0, but true != 1; object key order does not matter). Recursion is bounded by
    the value's depth, which `parse_json` bounds."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, int | float):
        return ("number", value)  # Python already makes 1 == 1.0 with equal hashes
    if isinstance(value, Mapping):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("array", tuple(_canonical(v) for v in value))
    return ("other", repr(value))


def _short(value: object, limit: int = 120) -> str:
    shown = repr(value)  # a hostile value may be a megabyte: the model gets its beginning
    return shown if len(shown) <= limit else f"{shown[:limit]}... ({len(shown)} characters)"


# --- formats ---------------------------------------------------------------------------

_DATE: Final = (r"\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
                r"|02-(?:0[1-9]|1\d|2[0-8]))|(?:\d\d(?:0[48]|[2468][048]|[13579][26])"
                r"|(?:[02468][048]|[13579][26])00)-02-29")
_OCTET: Final = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_H16: Final = r"[0-9A-Fa-f]{1,4}"
_LS32: Final = rf"(?:{_H16}:{_H16}|(?:{_OCTET}\.){{3}}{_OCTET})"
_IPV6: Final = "|".join((
    rf"(?:{_H16}:){{6}}{_LS32}", rf"::(?:{_H16}:){{5}}{_LS32}", rf"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}", rf"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}", rf"(?:(?:{_H16}:){{0,6}}{_H16})?::"))
_URI: Final = r"\w+:(\/?\/?)[^\s]+"
_URI_REFERENCE: Final = r"(\w+:(\/?\/?))?[^#\\\s]*(#[^\\\s]*)?"
_LABEL: Final = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])"

# fastjsonschema's default formats (draft04.py, draft06.py, draft07.py), anchored with \A..\z.
_DRAFT4_FORMATS: Final = {
    "date-time": rf"(?:{_DATE})(t|T)(?:[01]\d|2[0-3]):[0-5]\d:(?:[0-5]\d|60)(?:\.\d+)?"
                 r"(?:[+-](?:[01]\d|2[0-3]):[0-5]\d|[+-](?:[01]\d|2[0-3])[0-5]\d|z|Z)",
    "hostname": rf"(?:{_LABEL}\.)*{_LABEL}",
    "ipv4": rf"(?:{_OCTET}\.){{3}}{_OCTET}",
    "ipv6": rf"(?:{_IPV6})",
    "uri": _URI,
}
_DRAFT6_FORMATS: Final = {
    **_DRAFT4_FORMATS,
    "json-pointer": r"(/(([^/~])|(~[01]))*)*",
    "uri-reference": _URI_REFERENCE,
    "uri-template": (r"(?:(?:[^\x00-\x20\"'<>%\\^`{|}]|%[0-9a-f]{2})|"
                     r"\{[+#./;?&=,!@|]?(?:[a-z0-9_]|%[0-9a-f]{2})+"
                     r"(?::[1-9][0-9]{0,3}|\*)?(?:,(?:[a-z0-9_]|%[0-9a-f]{2})+(?::[1-9][0-9]{0,3}|\*)?)*\})*"),
}
_DRAFT7_FORMATS: Final = {
    **_DRAFT6_FORMATS,
    "date": rf"(?:{_DATE})",
    "iri": _URI,
    "iri-reference": _URI_REFERENCE,
    "idn-email": r"[^@]+@[^@]+\.[^@]+",
    "relative-json-pointer": r"(?:0|[1-9][0-9]*)(?:#|(?:\/(?:[^~/]|~0|~1)*)*)",
    "time": (r"([01]?\d|2[0-3]):([0-5]?\d)(?::([0-5]?\d|60)(?:\.(\d{1,6}))?"
             r"([zZ]|[+-](?:[01]\d|2[0-3]):[0-5]\d)?)?"),
}
# idn-hostname's lookahead (no "-" after the first dot) is checked in code below.
_IDN_HOSTNAME: Final = (r"(xn--)?[a-zA-Z0-9][a-zA-Z0-9-_]{0,61}[a-zA-Z0-9]{0,1}\."
                        r"(xn--)?([a-zA-Z0-9\-]{1,50}|[a-zA-Z0-9-]{1,30}\.[a-zA-Z]{2,})")


def _matches(expression: str, value: str) -> bool:
    return _search(rf"\A(?:{expression})\z", value)


def _is_email(value: str) -> bool:
    # fastjsonschema: ^(?!.*\.\..*@)[^@.][^@]*(?<!\.)@[^@]+\.[^@]+\Z, without the lookaround.
    local, at, domain = value.partition("@")
    return (bool(at) and bool(local) and not local.startswith(".") and not local.endswith(".")
            and ".." not in local and _matches(r"[^@]+\.[^@]+", domain))


def _is_idn_hostname(value: str) -> bool:
    _, dot, rest = value.partition(".")
    return bool(dot) and not rest.startswith("-") and _matches(_IDN_HOSTNAME, value)


def _is_regex(value: str) -> bool:
    return regex_problem(value) is None


def _format_checker(formats: Mapping[str, str], idn: bool) -> FormatChecker:
    checker = FormatChecker(formats=())

    def add(name: str, test: Callable[[str], bool]) -> None:
        checker.checks(name)(lambda value: not isinstance(value, str) or test(value))

    for name, expression in formats.items():
        add(name, functools.partial(_matches, expression))
    add("email", _is_email)
    add("regex", _is_regex)
    if idn:
        add("idn-hostname", _is_idn_hostname)
    return checker


# --- the validator classes -------------------------------------------------------------


def _extend(base: type[ValidatorProtocol], formats: Mapping[str, str], idn: bool) -> type[ValidatorProtocol]:
    replaced: dict[str, Keyword] = {
        "pattern": _pattern, "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties, "uniqueItems": _unique_items,
    }
    keywords = {**base.VALIDATORS, **replaced}
    counted = {name: _counted(fn) for name, fn in keywords.items()}
    extended: type[ValidatorProtocol] = jsonschema.validators.extend(
        base, counted, format_checker=_format_checker(formats, idn))
    return extended


DRAFTS: Final[Mapping[str, type[ValidatorProtocol]]] = {
    "draft-04": _extend(Draft4Validator, _DRAFT4_FORMATS, idn=False),
    "draft-06": _extend(Draft6Validator, _DRAFT6_FORMATS, idn=False),
    "draft-07": _extend(Draft7Validator, _DRAFT7_FORMATS, idn=True),
}
"""The validator class per draft. `$schema` picks one; without it, draft-07 (as fastjsonschema)."""
