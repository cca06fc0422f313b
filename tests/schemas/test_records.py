"""`records.py` and `schemas/*.avsc` describe the same records, so they cannot drift."""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import typing
from importlib import resources

import fastavro
import pytest

from torpor.schemas import records as r
from torpor.schemas.codec import TOP_LEVEL

TIME_FIELDS = frozenset({"created_at", "expires_at", "due_at", "deadline"})

RECORD_CLASSES = {
    name: obj
    for name, obj in vars(r).items()
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__module__ == r.__name__
}


def _files() -> dict[str, dict[str, object]]:
    root = resources.files("torpor.schemas")
    return {name: json.loads((root / f"{name}.avsc").read_text(encoding="utf-8")) for name in TOP_LEVEL}


def _definitions(node: object, out: list[dict[str, object]]) -> None:
    """Every record definition (not reference) in `node`, in document order."""
    if isinstance(node, list):
        for n in node:
            _definitions(n, out)
    elif isinstance(node, dict):
        if node.get("type") == "record":
            out.append(node)
            for f in typing.cast(list[dict[str, object]], node["fields"]):
                _definitions(f["type"], out)
        elif node.get("type") == "array":
            _definitions(node["items"], out)


def _all_definitions() -> dict[str, list[tuple[str, dict[str, object]]]]:
    found: dict[str, list[tuple[str, dict[str, object]]]] = {}
    for file, schema in _files().items():
        defs: list[dict[str, object]] = []
        _definitions(schema, defs)
        for d in defs:
            found.setdefault(str(d["name"]), []).append((file, d))
    return found


def _shape(avro: object) -> object:
    """An Avro type with docs dropped and records referred to by name."""
    if isinstance(avro, str):
        return avro
    if isinstance(avro, list):
        return [_shape(a) for a in avro]
    assert isinstance(avro, dict)
    if avro["type"] == "record":
        return avro["name"]
    if avro["type"] == "array":
        return {"array": _shape(avro["items"])}
    if "logicalType" in avro:
        return {avro["type"]: avro["logicalType"]}
    return _shape(avro["type"])


def _expected(tp: object, field: str) -> object:
    """The Avro type shape `records.py`'s mapping gives a field of Python type `tp`."""
    if isinstance(tp, types.UnionType):
        args = typing.get_args(tp)
        shapes = [_expected(a, field) for a in args if a is not type(None)]
        return ["null", *shapes] if type(None) in args else shapes
    if typing.get_origin(tp) is tuple:
        return {"array": _expected(typing.get_args(tp)[0], field)}
    primitives = {str: "string", bool: "boolean", bytes: "bytes", float: "double"}
    if tp in primitives:
        return primitives[tp]
    if tp is int:
        return {"long": "timestamp-millis"} if field in TIME_FIELDS else "long"
    assert isinstance(tp, type) and dataclasses.is_dataclass(tp), tp
    return tp.__name__


def test_every_record_class_has_exactly_one_schema_definition_and_back() -> None:
    definitions = _all_definitions()
    assert set(definitions) == set(RECORD_CLASSES)


@pytest.mark.parametrize("name", sorted(RECORD_CLASSES))
def test_record_class_matches_its_avsc_field_by_field(name: str) -> None:
    cls = RECORD_CLASSES[name]
    hints = typing.get_type_hints(cls, vars(r))
    for file, definition in _all_definitions()[name]:
        fields = typing.cast(list[dict[str, object]], definition["fields"])
        assert [f["name"] for f in fields] == [f.name for f in dataclasses.fields(cls)], file
        for f in fields:
            where = f"{file}.avsc {name}.{f['name']}"
            assert _shape(f["type"]) == _expected(hints[str(f["name"])], str(f["name"])), where
            assert isinstance(f.get("doc"), str) and f["doc"], f"{where}: no doc"
            if isinstance(f["type"], list) and "null" in f["type"]:
                assert f["type"][0] == "null" and "default" in f and f["default"] is None, (
                    f"{where}: an optional field is ['null', X] with default null"
                )
            else:
                assert "default" not in f, f"{where}: only optional fields have a default"
        assert isinstance(definition.get("doc"), str) and definition["doc"], f"{file}: {name} has no doc"


def test_a_record_shared_by_several_files_is_defined_identically_in_each() -> None:
    # Field by field, docs included; a top-level file's own record adds a namespace and a
    # sentence about the file to its record doc, so those two keys are not compared.
    for name, places in _all_definitions().items():
        first_file, first = places[0]
        for file, other in places[1:]:
            assert other["fields"] == first["fields"], (
                f"{name} differs between {first_file}.avsc and {file}.avsc"
            )


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_each_top_level_file_is_self_contained_in_namespace_torpor(name: str) -> None:
    schema = _files()[name]
    assert schema["name"] == name and schema["namespace"] == "torpor"
    # Parsing with an empty set of known names proves the file needs no other file.
    parsed = fastavro.parse_schema(schema, named_schemas={})
    assert isinstance(parsed, dict) and parsed["name"] == f"torpor.{name}"


def test_record_docstrings_open_the_schema_docs() -> None:
    for name, places in _all_definitions().items():
        first_line = inspect.cleandoc(RECORD_CLASSES[name].__doc__ or "").split("\n")[0]
        for file, definition in places:
            assert str(definition["doc"]).startswith(first_line), f"{file}.avsc {name}"
