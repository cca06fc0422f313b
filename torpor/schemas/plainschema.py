"""A quick check that a value certainly satisfies a plain JSON Schema (pure).

Contract. `certain_check(schema)` returns None for a schema outside the plain subset below,
else a function of a JSON value (as `jsontext.parse_json` returns it) that returns True
only if the schema certainly accepts the value under draft-04, -06 and -07 alike. False
says nothing: the caller asks the full validator, which decides and words the reason
(`jsontext.Validator`). So the check can only spare work, never change a verdict.

The plain subset, what most tools' argument schemas are (`{"type": "object",
"properties": {"command": {"type": "string"}}, "required": ["command"]}`): a schema object
whose keywords are among `type` (one name, not a list), `properties`, `required` and
`additionalProperties` (a boolean or a plain schema) for an object, `items` (one plain
schema) for an array, and the annotations (`title`, `description`, `default`, `examples`,
`$comment`, `$schema`), every subschema plain too; or annotations alone (any value).
Anything else (`enum`, `format`, `pattern`, bounds, `$ref`, the combinators, a boolean
schema) leaves the whole schema to the full validator.

Why: the full validator is jsonschema's, extended with metering and RE2 regexes
(`schemakeywords`); for `{"command": "cargo test"}` against the schema above it took ~10 us,
at every tool call the fold checks (bench/README.md, stop 44). Why it is conservative on
types: the drafts differ on `1.0` as an integer (draft-04 says no), so only a Python int
that is not a bool is an integer here, and a number is an int or a float (`parse_json`
refuses NaN and the infinities). The work is linear in the value and the schema, both
bounded by `jsontext`'s limits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

Check = Callable[[object], bool]

_ANNOTATIONS: Final = frozenset({"title", "description", "default", "examples", "$comment", "$schema"})
_KEYWORDS: Final = _ANNOTATIONS | {"type", "properties", "required", "additionalProperties", "items"}


def _accept(value: object) -> bool:
    return True


def _is_string(value: object) -> bool:
    return type(value) is str


def _is_boolean(value: object) -> bool:
    return type(value) is bool


def _is_null(value: object) -> bool:
    return value is None


def _is_integer(value: object) -> bool:
    return type(value) is int


def _is_number(value: object) -> bool:
    return type(value) is int or type(value) is float


_SCALARS: Final[dict[str, Check]] = {
    "string": _is_string,
    "boolean": _is_boolean,
    "null": _is_null,
    "integer": _is_integer,
    "number": _is_number,
}


def certain_check(schema: object) -> Check | None:
    """The quick check of `schema` (module docstring), or None if it is not plain."""
    if not isinstance(schema, dict) or not schema.keys() <= _KEYWORDS:
        return None
    kind = schema.get("type")
    if kind is None:
        # Without a type, only object and array keywords could apply, each to its own kind
        # of value: left to the full validator unless there are none (annotations only).
        return _accept if schema.keys() <= _ANNOTATIONS else None
    if not isinstance(kind, str):
        return None
    if kind == "object":
        return _object_check(schema)
    if kind == "array":
        if "properties" in schema or "required" in schema or "additionalProperties" in schema:
            return None
        items = schema.get("items")
        item_check = _accept if items is None else certain_check(items)
        return None if item_check is None else _ArrayCheck(item_check)
    scalar = _SCALARS.get(kind)
    if scalar is None or not schema.keys() <= _ANNOTATIONS | {"type"}:
        return None
    return scalar


def _object_check(schema: dict[str, object]) -> Check | None:
    if "items" in schema:
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, dict) or not isinstance(required, list):
        return None
    if not all(isinstance(name, str) for name in required):
        return None
    checks: dict[str, Check] = {}
    for name, subschema in properties.items():
        check = certain_check(subschema)
        if check is None:
            return None
        checks[name] = check
    extra_check: Check | None
    if extra is True:
        extra_check = _accept
    elif extra is False:
        extra_check = None  # no property beyond `properties`
    else:
        extra_check = certain_check(extra)
        if extra_check is None:
            return None
    return _ObjectCheck(checks, tuple(required), extra_check)


class _ObjectCheck:
    """A JSON object whose named properties pass their checks, with every required one
    present, and whose other properties pass `extra` (None: none may be there)."""

    __slots__ = ("_checks", "_extra", "_required")

    def __init__(self, checks: dict[str, Check], required: tuple[str, ...], extra: Check | None) -> None:
        self._checks = checks
        self._required = required
        self._extra = extra

    def __call__(self, value: object) -> bool:
        if type(value) is not dict:
            return False
        for name in self._required:
            if name not in value:
                return False
        checks, extra = self._checks, self._extra
        for name, item in value.items():
            check = checks.get(name, extra)
            if check is None or not check(item):
                return False
        return True


class _ArrayCheck:
    """A JSON array whose items all pass `item`."""

    __slots__ = ("_item",)

    def __init__(self, item: Check) -> None:
        self._item = item

    def __call__(self, value: object) -> bool:
        if type(value) is not list:
            return False
        item = self._item
        return all(item(element) for element in value)
