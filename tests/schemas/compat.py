"""Avro schema compatibility, by the specification's resolution rules (the subset we use).

`read_problems(reader, writer)` lists why data written with `writer` cannot be read with
`reader` (empty: it can). `compatibility_problems(old, new)` checks both directions:
backward (the new reader reads old data) and forward (an old reader reads new data), the
rule `DESIGN.md` sets for every schema change. Records match by full name; a reader
field the writer lacks needs a default; a writer union branch needs a reader branch that
reads it; the promotions int->long->float->double and string<->bytes are allowed.
Logical types and docs do not matter.
"""

from __future__ import annotations

import fastavro

_PROMOTIONS = {
    ("int", "long"),
    ("int", "float"),
    ("int", "double"),
    ("long", "float"),
    ("long", "double"),
    ("float", "double"),
    ("string", "bytes"),
    ("bytes", "string"),
}


def _expand(schema: dict[str, object]) -> object:
    """`schema` with every named reference inlined and names made full."""
    return fastavro.schema.expand_schema(fastavro.parse_schema(schema, named_schemas={}))


def _kind(node: object) -> str:
    if isinstance(node, list):
        return "union"
    if isinstance(node, str):
        return node
    assert isinstance(node, dict)
    kind = node["type"]
    return kind if isinstance(kind, str) else _kind(kind)


def _unwrap(node: object) -> object:
    """A primitive written as ``{"type": "long", "logicalType": ...}`` is just ``"long"``."""
    if isinstance(node, dict) and node.get("type") not in ("record", "array", "map", "enum", "fixed"):
        return _unwrap(node["type"])
    return node


def _problems(reader: object, writer: object, path: str) -> list[str]:
    reader, writer = _unwrap(reader), _unwrap(writer)
    if isinstance(writer, list):
        out: list[str] = []
        for branch in writer:
            if _problems(reader, branch, path):
                out.append(f"{path}: writer branch {_name(branch)} has no reader branch that reads it")
        return out
    if isinstance(reader, list):
        if any(not _problems(branch, writer, path) for branch in reader):
            return []
        return [f"{path}: no reader branch reads writer {_name(writer)}"]
    rk, wk = _kind(reader), _kind(writer)
    if rk != wk:
        return [] if (wk, rk) in _PROMOTIONS else [f"{path}: writer {wk} cannot be read as {rk}"]
    if rk == "array":
        assert isinstance(reader, dict) and isinstance(writer, dict)
        return _problems(reader["items"], writer["items"], f"{path}[]")
    if rk == "record":
        assert isinstance(reader, dict) and isinstance(writer, dict)
        if reader["name"] != writer["name"]:
            return [f"{path}: record {writer['name']} is not {reader['name']}"]
        writer_fields = {f["name"]: f for f in writer["fields"]}
        out = []
        for field in reader["fields"]:
            where = f"{path}.{field['name']}"
            if field["name"] in writer_fields:
                out += _problems(field["type"], writer_fields[field["name"]]["type"], where)
            elif "default" not in field:
                out.append(f"{where}: reader field missing from the writer has no default")
        return out
    return []


def _name(node: object) -> str:
    node = _unwrap(node)
    return str(node["name"]) if isinstance(node, dict) and "name" in node else _kind(node)


def read_problems(reader: dict[str, object], writer: dict[str, object]) -> list[str]:
    """Why data written with `writer` cannot be read with `reader`; empty if it can."""
    return _problems(_expand(reader), _expand(writer), str(reader.get("name")))


def compatibility_problems(old: dict[str, object], new: dict[str, object]) -> list[str]:
    """Why `new` is not backward and forward (full) compatible with `old`; empty if it is."""
    backward = [f"backward: {p}" for p in read_problems(new, old)]
    forward = [f"forward: {p}" for p in read_problems(old, new)]
    return backward + forward
