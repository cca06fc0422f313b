"""Untrusted JSON text and JSON Schemas, judged in bounded, deterministic work (pure).

Anyone who can write to `inputs` writes JSON the fold must read: a model's tool-call
arguments, a connector's result, a `CreateThread`'s tool schemas. This module is the one
place that reads them. It does no I/O and keeps no state but memo caches of pure
functions, so a replay of the log judges every text exactly as the live run did.

Contract.

- `parse_json(text)` returns the value, or raises `JsonTextError` with a short reason
  (`not JSON: ...`, `nested deeper than 64 levels`). It never raises `RecursionError`:
  the nesting depth is measured by a linear scan of the text *before* `json.loads`, so
  the verdict depends on the text alone, never on how deep the caller's stack happens
  to be (a `RecursionError` caught from `json.loads` would: a replay could judge the
  same input differently). `NaN`, `Infinity` and `-Infinity`, which `json.loads`
  accepts but JSON does not, are refused: other languages' readers of the same log
  reject them, and `NaN != NaN` would make "same arguments" checks lie.
- `schema_problem(text)` says why a JSON Schema text cannot be registered, or None:
  not JSON, too large or too deep, an unsupported `$schema`, not valid against its
  metaschema, a regex RE2 cannot compile (backreferences, lookaround), a `$ref` that is
  not a local `#...` reference or does not resolve. Registration is where a bad schema
  is refused (`CreateThread`, a connector's manifest), not at the first call.
- `compile_schema(text)` returns a `Validator` (memoised per text); it raises
  `InvalidSchemaError` for a text `schema_problem` refuses. Calling the validator on a
  value returns None or raises `SchemaViolation` with a readable reason (`data.q: 5 is
  not of type 'string'`). Without `$schema` the draft is draft-07, as fastjsonschema
  (Torpor's previous validator) assumed, and its default formats are checked. Regexes
  run on RE2 in linear time and every validation is metered (see
  `torpor.schemas.schemakeywords`); a value a plain schema certainly accepts is accepted
  by a quick check first (`torpor.schemas.plainschema`). No `$ref` is ever retrieved: the
  validator's registry is empty, so even a remote reference that slipped through fails
  validation instead of opening a socket.
- `tool_spec_problem(spec)`: a `ToolSpec`'s `parameters` (an object schema: the
  arguments are a JSON object) and `result_schema` pass `schema_problem`.

Limits, and why each exists:

- `MAX_DEPTH` = 64 levels of nesting in a value. Every reader of a value (json, the
  validator, equality, canonical keys) recurses once per level; 64 keeps all of them far
  from the interpreter's recursion limit, and no tool's arguments come near it.
- `MAX_SCHEMA_DEPTH` = 32 levels in a schema text: validating a schema against its
  metaschema recurses several frames per level; real tool schemas nest under ten.
- `MAX_SCHEMA_CHARS` = 131,072 characters per schema: a `CreateThread` is snapshotted
  into the thread's state (one record), and each schema is compiled in the fold thread;
  large generated tool schemas are tens of kilobytes.
- `MAX_PATTERNS` = 256 regexes per schema (`pattern`, `patternProperties`): each is
  compiled and cached; real tool schemas have a handful.
- `schemakeywords.MAX_STEPS` and `MAX_NESTING` bound the work of one validation; a
  keyword that searches every property name with every pattern is charged their product.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from typing import Final
from urllib.parse import unquote

import re2
import referencing.exceptions
from jsonschema.protocols import Validator as ValidatorProtocol
from referencing import Registry

from torpor.schemas.errors import InvalidSchemaError, JsonTextError, SchemaViolation
from torpor.schemas.plainschema import Check, certain_check
from torpor.schemas.records import ToolSpec
from torpor.schemas.schemakeywords import (
    DRAFTS,
    ValidationBudgetExceeded,
    metered,
    regex_problem,
)

MAX_DEPTH: Final = 64
MAX_SCHEMA_DEPTH: Final = 32
MAX_SCHEMA_CHARS: Final = 131_072
MAX_PATTERNS: Final = 256
"""Regexes per schema: each is compiled and kept (`schemakeywords.compiled_regex` holds
1,024); real tool schemas have a handful."""
MAX_REASON_CHARS: Final = 300
"""A violation's reason goes into the model's history: enough to fix the call, never the whole value."""

DEFAULT_DRAFT: Final = "draft-07"
_METASCHEMAS: Final = {
    "http://json-schema.org/draft-04/schema": "draft-04",
    "http://json-schema.org/draft-06/schema": "draft-06",
    "http://json-schema.org/draft-07/schema": "draft-07",
}
_EMPTY_REGISTRY: Final[Registry[object]] = Registry()

# A JSON string literal, or one bracket. RE2: linear even on an unterminated string.
_TOKENS: Final = re2.compile(r'(?s)"(?:[^"\\]|\\.)*"|[\[\]{}]')


def parse_json(text: str, *, max_depth: int = MAX_DEPTH) -> object:
    """The value of JSON `text`; `JsonTextError` if it is not JSON or nests deeper than `max_depth`."""
    if text.count("[") + text.count("{") > max_depth:  # else it cannot nest too deep: skip the scan
        _check_depth(text, max_depth)
    try:
        if isinstance(text, str) and not text.startswith("\ufeff"):
            return _DECODER.decode(text)
        return json.loads(text, parse_constant=_refuse_constant)  # its own words for a BOM or bytes
    except JsonTextError:
        raise
    except ValueError as error:  # JSONDecodeError, or an integer past Python's digit limit
        raise JsonTextError(f"not JSON: {error}") from None


def _check_depth(text: str, max_depth: int) -> None:
    depth = 0
    for token in _TOKENS.finditer(text):
        opening = text[token.start()]
        if opening in "[{":
            depth += 1
            if depth > max_depth:
                raise JsonTextError(f"nested deeper than {max_depth} levels")
        elif opening in "]}":
            depth -= 1


def _refuse_constant(name: str) -> object:
    raise JsonTextError(f"not JSON: {name} is not a JSON number")


# One decoder for every call: `json.loads` with an option builds a new one each time (what
# it does then is this decoder's `decode`, after its check for a BOM and for bytes).
_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant)


class Validator:
    """A compiled JSON Schema: call it on a value; `SchemaViolation` if the value breaks it.

    `certain`: a quick check of a plain schema (`plainschema.certain_check`): a value it
    accepts is accepted without the full validator, which decides every other value."""

    __slots__ = ("_certain", "_validator")

    def __init__(self, validator: ValidatorProtocol, certain: Check | None = None) -> None:
        self._validator = validator
        self._certain = certain

    def __call__(self, value: object) -> None:
        if self._certain is not None and self._certain(value):
            return
        with metered():
            errors = self._validator.iter_errors(value)
            try:
                error = next(errors, None)
            except ValidationBudgetExceeded as exceeded:
                raise SchemaViolation(str(exceeded)) from None
            except referencing.exceptions.Unresolvable as unresolvable:
                raise SchemaViolation(f"unresolvable $ref: {unresolvable}") from None
            finally:
                errors.close()
        if error is not None:
            raise SchemaViolation(_clip(f"{_where(error.absolute_path)}: {error.message}"))


@functools.lru_cache(maxsize=512)
def compile_schema(schema_text: str) -> Validator:
    """The validator of `schema_text`; `InvalidSchemaError` if `schema_problem` refuses it."""
    problem = schema_problem(schema_text)
    if problem is not None:
        raise InvalidSchemaError(problem)
    schema = parse_json(schema_text, max_depth=MAX_SCHEMA_DEPTH)
    cls = DRAFTS[_draft_of(schema) or DEFAULT_DRAFT]
    return Validator(cls(schema, registry=_EMPTY_REGISTRY, format_checker=cls.FORMAT_CHECKER),
                     certain_check(schema))


@functools.lru_cache(maxsize=512)
def schema_problem(schema_text: str) -> str | None:
    """Why `schema_text` cannot be registered as a JSON Schema, or None. See the module docstring."""
    if len(schema_text) > MAX_SCHEMA_CHARS:
        return f"larger than {MAX_SCHEMA_CHARS} characters"
    try:
        schema = parse_json(schema_text, max_depth=MAX_SCHEMA_DEPTH)
    except JsonTextError as error:
        return str(error)
    if not isinstance(schema, dict | bool):
        return "not a JSON Schema: a schema is an object or a boolean"
    draft = _draft_of(schema)
    if draft is None and isinstance(schema, dict) and "$schema" in schema:
        return f"unsupported $schema {_clip(repr(schema['$schema']))} (draft-04, -06 or -07)"
    problem = next(_keyword_problems(schema), None)
    if problem is not None:
        return problem
    cls = DRAFTS[draft or DEFAULT_DRAFT]
    metaschema = cls(cls.META_SCHEMA, registry=_EMPTY_REGISTRY, format_checker=cls.FORMAT_CHECKER)
    try:
        Validator(metaschema)(schema)
    except SchemaViolation as violation:
        return _clip(f"not a valid JSON Schema: {violation}")
    return None


def tool_spec_problem(spec: ToolSpec) -> str | None:
    """Why `spec` cannot be registered (`parameters: ...`, `result_schema: ...`), or None."""
    problem = schema_problem(spec.parameters)
    if problem is not None:
        return f"parameters: {problem}"
    parameters = parse_json(spec.parameters, max_depth=MAX_SCHEMA_DEPTH)
    if not isinstance(parameters, dict) or parameters.get("type", "object") not in ("object", ["object"]):
        return "parameters: not an object schema (a tool's arguments are a JSON object)"
    if spec.result_schema is not None:
        problem = schema_problem(spec.result_schema)
        if problem is not None:
            return f"result_schema: {problem}"
    return None


# --- helpers ---------------------------------------------------------------------------


def _draft_of(schema: object) -> str | None:
    if not isinstance(schema, dict) or not isinstance(schema.get("$schema"), str):
        return None
    uri = str(schema["$schema"]).rstrip("#").replace("https://", "http://", 1)
    return _METASCHEMAS.get(uri)


_SCHEMA_MAPS: Final = ("properties", "patternProperties", "definitions", "$defs", "dependencies")
_SCHEMA_LISTS: Final = ("allOf", "anyOf", "oneOf")
_SCHEMA_ONES: Final = ("additionalItems", "additionalProperties", "contains", "propertyNames",
                       "not", "if", "then", "else")


def _subschemas(schema: dict[str, object]) -> Iterator[object]:
    """The schemas directly inside `schema` (not `enum`, `const` or `default` data)."""
    for keyword in _SCHEMA_MAPS:
        named = schema.get(keyword)
        if isinstance(named, dict):
            yield from named.values()
    for keyword in _SCHEMA_LISTS:
        listed = schema.get(keyword)
        if isinstance(listed, list):
            yield from listed
    for keyword in _SCHEMA_ONES:
        if keyword in schema:
            yield schema[keyword]
    items = schema.get("items")
    yield from items if isinstance(items, list) else ([items] if items is not None else [])


def _keyword_problems(root: object) -> Iterator[str]:
    """Regexes RE2 refuses and `$ref`s that are not local or do not resolve (iterative walk)."""
    stack: list[object] = [root]
    count = 0
    while stack:
        schema = stack.pop()
        if not isinstance(schema, dict):
            continue
        pattern, named = schema.get("pattern"), schema.get("patternProperties")
        patterns = [pattern] if isinstance(pattern, str) else []
        if isinstance(named, dict):
            patterns.extend(str(name) for name in named)
        count += len(patterns)
        if count > MAX_PATTERNS:
            yield f"more than {MAX_PATTERNS} regular expressions"
            return
        for pattern in patterns:
            problem = regex_problem(pattern)
            if problem is not None:
                yield _clip(f"pattern {pattern!r} is not supported by RE2: {problem}")
        ref = schema.get("$ref")
        if isinstance(ref, str):
            if not ref.startswith("#"):
                yield _clip(f"$ref {ref!r} is not allowed: only local references (#...) are")
            elif (ref.startswith("#/") or ref == "#") and not _resolves(root, ref[1:]):
                yield _clip(f"$ref {ref!r} does not resolve")
        stack.extend(reversed(list(_subschemas(schema))))


def _resolves(root: object, pointer: str) -> bool:
    node: object = root
    for part in pointer.split("/")[1:]:
        key = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return False
    return True


def _where(path: Iterable[object]) -> str:
    return "data" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)


def _clip(reason: str) -> str:
    return reason if len(reason) <= MAX_REASON_CHARS else f"{reason[:MAX_REASON_CHARS]}..."

