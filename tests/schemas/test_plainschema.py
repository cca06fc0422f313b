"""The quick check of plain schemas (`plainschema.certain_check`) never accepts a value the
full validator refuses, under any draft; it does accept the values built to fit a plain
schema (else it would spare nothing); and every other schema is left to the full validator.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from torpor.schemas.errors import SchemaViolation
from torpor.schemas.jsontext import _EMPTY_REGISTRY, MAX_DEPTH, Validator, compile_schema, parse_json
from torpor.schemas.plainschema import certain_check
from torpor.schemas.schemakeywords import DRAFTS

DRAFT_URIS = {
    "draft-04": "http://json-schema.org/draft-04/schema#",
    "draft-06": "http://json-schema.org/draft-06/schema#",
    "draft-07": "http://json-schema.org/draft-07/schema#",
}
SCALAR_KINDS = ("string", "boolean", "null", "integer", "number")
NAMES = st.sampled_from(["a", "b", "command", "n", ""])
ANNOTATION = st.fixed_dictionaries({}, optional={"description": st.text(max_size=5), "title": st.just("t")})


def _plain(children: st.SearchStrategy[dict[str, object]]) -> st.SearchStrategy[dict[str, object]]:
    objects = st.builds(
        lambda props, required, extra, notes: {
            "type": "object", "properties": props, **({"required": required} if required else {}),
            **({} if extra is None else {"additionalProperties": extra}), **notes},
        st.dictionaries(NAMES, children, max_size=3),
        st.lists(NAMES, max_size=2, unique=True),
        st.one_of(st.none(), st.booleans(), children),
        ANNOTATION,
    )
    arrays = st.builds(lambda items, notes: {"type": "array", **({} if items is None else {"items": items}),
                                             **notes},
                       st.one_of(st.none(), children), ANNOTATION)
    return st.one_of(objects, arrays)


SCALAR = st.builds(lambda kind, notes: {"type": kind, **notes}, st.sampled_from(SCALAR_KINDS), ANNOTATION)
PLAIN = st.recursive(
    st.one_of(SCALAR, ANNOTATION),
    _plain, max_leaves=8,
)
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=5)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(NAMES, inner, max_size=3)),
    max_leaves=10,
)


def full(schema: dict[str, object], draft: str) -> Validator:
    """The full validator alone (no quick check), as `compile_schema` builds it."""
    cls = DRAFTS[draft]
    return Validator(cls(schema, registry=_EMPTY_REGISTRY, format_checker=cls.FORMAT_CHECKER))


def fitting(schema: dict[str, object]) -> st.SearchStrategy[object] | None:
    """Values built to fit plain `schema`, the kind of values the check is for (None: none
    can, as for a required name that no property may have)."""
    kind = schema.get("type")
    if kind is None:
        return JSON
    if kind == "object":
        props = dict(schema.get("properties", {}))  # type: ignore[call-overload]
        extra = schema.get("additionalProperties", True)
        other = extra if isinstance(extra, dict) else {}  # what a name beyond `properties` must fit
        needed: dict[str, st.SearchStrategy[object]] = {}
        for name in schema.get("required", []):  # type: ignore[attr-defined]
            strategy = fitting(props.get(name, other)) if name in props or extra is not False else None
            if strategy is None:
                return None
            needed[name] = strategy
        optional = {name: fitting(sub) for name, sub in props.items() if name not in needed}
        return st.fixed_dictionaries(needed, optional={n: f for n, f in optional.items() if f is not None})
    if kind == "array":
        item = fitting(schema.get("items", {}))  # type: ignore[arg-type]
        return st.just([]) if item is None else st.lists(item, max_size=3)
    numbers = st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False))
    return {"string": st.text(max_size=5), "boolean": st.booleans(), "null": st.none(),
            "integer": st.integers(), "number": numbers}[kind]  # type: ignore[index]


@settings(max_examples=300, deadline=None)
@given(schema=PLAIN, value=JSON, draft=st.sampled_from(sorted(DRAFT_URIS)))
def test_what_the_quick_check_accepts_the_full_validator_accepts_under_every_draft(
    schema: dict[str, object], value: object, draft: str
) -> None:
    check = certain_check(schema)
    assert check is not None  # plain by construction
    if check(value):
        full({**schema, "$schema": DRAFT_URIS[draft]}, draft)(value)  # raises if it refuses


@settings(max_examples=200, deadline=None)
@given(data=st.data(), schema=PLAIN, draft=st.sampled_from(sorted(DRAFT_URIS)))
def test_the_quick_check_accepts_values_built_to_fit_and_so_does_the_full_validator(
    data: st.DataObject, schema: dict[str, object], draft: str
) -> None:
    strategy = fitting(schema)
    assume(strategy is not None)
    assert strategy is not None
    value = data.draw(strategy)
    check = certain_check(schema)
    assert check is not None and check(value)
    full({**schema, "$schema": DRAFT_URIS[draft]}, draft)(value)


@pytest.mark.parametrize("schema", [
    True, False, {"type": ["string", "null"]}, {"type": "string", "minLength": 1}, {"enum": [1, 2]},
    {"type": "string", "format": "email"}, {"type": "string", "pattern": "a"}, {"$ref": "#/definitions/x"},
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}},
    {"type": "object", "patternProperties": {"a": {}}}, {"allOf": [{"type": "object"}]},
    {"type": "array", "items": [{"type": "string"}]},
    {"type": "object", "additionalProperties": {"enum": [1]}},
    {"type": "integer", "minimum": 0}, {"properties": {"a": {"type": "string"}}},
])
def test_a_schema_that_is_not_plain_is_left_to_the_full_validator(schema: object) -> None:
    assert certain_check(schema) is None


@pytest.mark.parametrize(("draft", "value", "accepted"), [
    ("draft-04", 1.0, False), ("draft-07", 1.0, True), ("draft-07", True, False), ("draft-07", 3, True),
])
def test_integers_the_drafts_disagree_on_are_decided_by_the_full_validator(draft: str, value: object,
                                                                           accepted: bool) -> None:
    schema = {"$schema": DRAFT_URIS[draft], "type": "object", "properties": {"n": {"type": "integer"}}}
    validator = compile_schema(json.dumps(schema))
    if accepted:
        validator({"n": value})
    else:
        with pytest.raises(SchemaViolation, match="not of type 'integer'"):
            validator({"n": value})


def test_a_refused_value_gets_the_full_validators_reason_and_hostile_values_only_cost_linear_work() -> None:
    schema = json.dumps({"type": "object", "properties": {"command": {"type": "string"}},
                         "required": ["command"], "additionalProperties": False})
    validator = compile_schema(schema)
    validator({"command": "c" * 1_000_000})  # a huge string: one type check
    with pytest.raises(SchemaViolation, match="'command' is a required property"):
        validator({})
    with pytest.raises(SchemaViolation, match="Additional properties are not allowed"):
        validator({"command": "x", "rm": "-rf"})
    deep = parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    nested = compile_schema(json.dumps({"type": "array", "items": {"type": "array"}}))
    nested(deep)  # the quick check reads two levels; nothing recurses with the value
    with pytest.raises(SchemaViolation):
        validator({"command": ["not", "a", "string"]})
