"""`torpor.schemas.jsontext`: bounded JSON text and JSON Schemas for untrusted input."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torpor.connectors.approvals import DEPLOY_SPEC
from torpor.connectors.echo import ECHO_SPEC
from torpor.connectors.http_tool import HTTP_REQUEST_SPEC
from torpor.connectors.subprocess_tool import RUN_COMMAND_SPEC
from torpor.connectors.subscriptions import WATCH_SPEC
from torpor.connectors.timers import TIMER_SPEC
from torpor.processors.fold.builtins import BUILTIN_TOOLS
from torpor.schemas.errors import InvalidSchemaError, JsonTextError, SchemaViolation
from torpor.schemas.jsontext import (
    MAX_DEPTH,
    MAX_SCHEMA_CHARS,
    compile_schema,
    parse_json,
    schema_problem,
    tool_spec_problem,
)
from torpor.schemas.records import ToolSpec


def nested(levels: int, opening: str = "[", closing: str = "]") -> str:
    return opening * levels + closing * levels


def test_text_nested_past_the_limit_is_refused_whatever_the_callers_stack() -> None:
    def at_depth(frames: int, then: Callable[[], object]) -> object:
        return then() if frames == 0 else at_depth(frames - 1, then)

    for text in (nested(50_000), nested(MAX_DEPTH + 1), '{"a":' * 65 + "1" + "}" * 65):
        with pytest.raises(JsonTextError, match=f"^nested deeper than {MAX_DEPTH} levels$"):
            parse_json(text)
        with pytest.raises(JsonTextError, match="nested deeper"):
            at_depth(sys.getrecursionlimit() - 200, lambda text=text: parse_json(text))  # type: ignore[misc]
    assert parse_json(nested(MAX_DEPTH)) == json.loads(nested(MAX_DEPTH))


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = json.dumps({"q": "[" * 1000, "r": '\\"[{' * 100})
    assert parse_json(text) == json.loads(text)


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"x": -Infinity}', "", "{", "[1,]", "1" * 5000])
def test_text_that_is_not_json_is_a_json_text_error(text: str) -> None:
    with pytest.raises(JsonTextError, match=r"^not JSON: "):
        parse_json(text)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3),
    max_leaves=30,
)


@given(st.text())
def test_arbitrary_text_is_a_value_or_a_json_text_error(text: str) -> None:
    try:
        value = parse_json(text)
    except JsonTextError:
        return
    assert value == json.loads(text)


@given(JSON, st.integers(0, 100), st.sampled_from([("[", "]"), ('{"k":', "}")]))
def test_nested_json_agrees_with_json_loads_within_the_limit(
        value: object, wrap: int, brackets: tuple[str, str]) -> None:
    text = brackets[0] * wrap + json.dumps(value) + brackets[1] * wrap
    try:
        parsed = parse_json(text)
    except JsonTextError as error:
        assert str(error) == f"nested deeper than {MAX_DEPTH} levels" and wrap > 0
        return
    assert json.dumps(parsed) == json.dumps(json.loads(text))


# --- schemas ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ("{", "not JSON"),
        ("[]", "not a JSON Schema"),
        (json.dumps({"type": "strin"}), "not a valid JSON Schema"),
        (json.dumps({"pattern": "(a)\\1"}), "not supported by RE2"),
        (json.dumps({"patternProperties": {"(?<=a)b": {}}}), "not supported by RE2"),
        (json.dumps({"properties": {"p": {"$ref": "https://example.com/s.json"}}}), "only local references"),
        (json.dumps({"$ref": "#/definitions/missing"}), "does not resolve"),
        (json.dumps({"$schema": "https://json-schema.org/draft/2020-12/schema"}), "unsupported $schema"),
        ('{"not":' * 40 + "{}" + "}" * 40, "nested deeper than 32"),
        (json.dumps({"description": "x" * MAX_SCHEMA_CHARS}), "larger than"),
    ],
)
def test_a_schema_that_cannot_be_registered_says_why(schema: str, why: str) -> None:
    problem = schema_problem(schema)
    assert problem is not None and why in problem
    with pytest.raises(InvalidSchemaError):
        compile_schema(schema)


def test_data_that_looks_like_a_schema_is_not_judged_as_one() -> None:
    assert schema_problem(json.dumps({"enum": [{"pattern": "(a)\\1", "$ref": "http://x"}]})) is None


def test_a_remote_ref_is_never_retrieved(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sockets(*args: object, **kwargs: object) -> None:
        raise AssertionError("a socket was opened")

    monkeypatch.setattr(socket, "socket", no_sockets)
    monkeypatch.setattr(socket, "create_connection", no_sockets)
    assert "only local references" in (schema_problem('{"$ref": "http://127.0.0.1:9/s"}') or "")
    # A local-looking $ref under a nested $id means a remote document: it fails, offline.
    sneaky = {"$id": "http://127.0.0.1:9/root", "y": {}, "properties": {"a": {"$ref": "#/definitions/x"}},
              "definitions": {"x": {"$id": "other.json", "items": {"$ref": "#/y"}}}}
    with pytest.raises(SchemaViolation, match="unresolvable"):
        compile_schema(json.dumps(sneaky))({"a": [1]})


def test_a_violation_names_where_and_what() -> None:
    validate = compile_schema(json.dumps({"type": "object", "properties": {"q": {"type": "string"}},
                                          "required": ["q"], "additionalProperties": False}))
    validate({"q": "x"})
    for value, why in [({"q": 5}, "data.q: 5 is not of type 'string'"),
                       ({}, "data: 'q' is a required property"),
                       ({"q": "x", "r": 1}, "data: Additional properties are not allowed ('r' unexpected)")]:
        with pytest.raises(SchemaViolation) as caught:
            validate(value)
        assert str(caught.value) == why


def test_a_backtracking_pattern_runs_in_linear_time() -> None:
    validate = compile_schema(json.dumps({"type": "string", "pattern": "^(a+)+$"}))
    validate("a" * 5_000)
    with pytest.raises(SchemaViolation, match="does not match"):
        validate("a" * 5_000 + "!")
    keyed = compile_schema(json.dumps({"patternProperties": {"^(a+)+$": {"type": "integer"}},
                                       "additionalProperties": False}))
    with pytest.raises(SchemaViolation, match="Additional properties"):
        keyed({"a" * 5_000 + "!": 1})


def test_a_schema_that_fans_out_or_loops_stops_after_bounded_work() -> None:
    doubling = compile_schema(json.dumps({"items": {"allOf": [{"$ref": "#"}, {"$ref": "#"}]}}))
    with pytest.raises(SchemaViolation, match="more than 50000 steps"):
        doubling(json.loads(nested(40)))
    looping = compile_schema(json.dumps({"allOf": [{"$ref": "#"}]}))
    with pytest.raises(SchemaViolation, match="nested deeper than 128"):
        looping(1)


def test_unique_items_compares_as_json_schema_does() -> None:
    validate = compile_schema(json.dumps({"uniqueItems": True}))
    validate([1, True, "1", {"a": 1}, {"a": 2}, [1], [True]])
    for repeated in ([1, 1.0], [{"a": 1, "b": 2}, {"b": 2, "a": 1}], [[{"x": None}], [{"x": None}]]):
        with pytest.raises(SchemaViolation, match="non-unique"):
            validate(repeated)
    validate(list(range(50_000)))


@pytest.mark.parametrize(
    ("format_", "good", "bad"),
    [("email", "a.b@c.d", "a..b@c.d"), ("ipv4", "10.0.0.1", "10.0.0.256"), ("ipv6", "fe80::1", "1::2::3"),
     ("date-time", "2026-01-31T09:00:00Z", "2026-02-30T09:00:00Z"), ("date", "2024-02-29", "2023-02-29"),
     ("hostname", "example.com", "-bad.com"), ("regex", "^a+$", "(a)\\1"),
     ("uri", "https://x/y", "no scheme"),
     ("idn-hostname", "xn--bcher-kva.example", "a.-b")],
)
def test_the_default_formats_are_checked_as_before(format_: str, good: str, bad: str) -> None:
    validate = compile_schema(json.dumps({"format": format_}))
    validate(good)
    validate(7)  # a format only constrains strings
    with pytest.raises(SchemaViolation, match=f"is not a '{format_}'"):
        validate(bad)


def test_every_shipped_tool_spec_is_valid() -> None:
    for spec in (*BUILTIN_TOOLS, ECHO_SPEC, TIMER_SPEC, WATCH_SPEC, DEPLOY_SPEC, HTTP_REQUEST_SPEC,
                 RUN_COMMAND_SPEC):
        assert tool_spec_problem(spec) is None, spec.name


def test_a_tool_spec_needs_an_object_schema_for_its_arguments() -> None:
    spec = ToolSpec("t", "", "{}", None, False, None)
    assert tool_spec_problem(spec) is None
    assert tool_spec_problem(ToolSpec("t", "", '{"type": "array"}', None, False, None)) == (
        "parameters: not an object schema (a tool's arguments are a JSON object)")
    assert (tool_spec_problem(ToolSpec("t", "", "{}", '{"pattern": "(?=a)"}', False, None)) or "").startswith(
        "result_schema: pattern")


def _loads_outcome(text: str) -> object:
    def refuse(name: str) -> object:
        raise JsonTextError(f"not JSON: {name} is not a JSON number")
    try:
        return ("value", json.loads(text, parse_constant=refuse))
    except JsonTextError as error:
        return ("error", str(error))
    except ValueError as error:
        return ("error", f"not JSON: {error}")


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=30) | st.text(alphabet='\ufeff[]{}",:0123456789.eE-NaIfinty \\u', max_size=30))
def test_parse_json_says_what_json_loads_said_for_any_text(text: str) -> None:
    """The one reused decoder reads and refuses exactly as `json.loads` with the option did."""
    try:
        outcome: object = ("value", parse_json(text))
    except JsonTextError as error:
        outcome = ("error", str(error))
    expected = _loads_outcome(text)
    if text.count("[") + text.count("{") > MAX_DEPTH:  # the depth scan may refuse first
        return
    assert repr(outcome) == repr(expected)
