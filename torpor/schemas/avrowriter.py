"""Avro binary encoding of Torpor's records, written straight from the dataclasses.

`record_writer(parsed)` turns a parsed record schema (fastavro's form, as the codec holds
it) into a function from a record to its schemaless Avro bytes: the bytes fastavro's
`schemaless_writer` produces for the same record (a test compares the two on every
record class), without the intermediate dict of `convert.plan_for` and without fastavro
walking the schema again for every record (about 115,000 instructions for one assistant
turn's history entry; the hash chain, every history row and every output record pay it).

Only what the shipped schemas use is written here: records, arrays, `null`, `boolean`,
`long`, `double`, `string`, `bytes`, a union of `null` and one type, and a union of
records chosen by the value's class (`torpor.<ClassName>`). A value of any other Python
type than the one its schema expects (an `int` where a `double` goes, a `bool` where a
`long` goes, a long out of the 64-bit range) raises `NotWritable`, and the codec writes
that record with fastavro instead: same bytes or the same error as before, by construction.
`record_writer` raises `NotWritable` for a schema outside that subset.
"""

from __future__ import annotations

import struct
import typing
from collections.abc import Callable
from typing import Final

Parts = list[bytes]
_Write = Callable[[Parts, object], None]

LONG_MIN: Final = -(1 << 63)
LONG_MAX: Final = (1 << 63) - 1  # an Avro long's range (fold.calls bounds a timer by it)
_SMALL: Final = tuple(bytes((n,)) for n in range(128))  # a varint below 128 is one byte
_TRUE: Final = b"\x01"
_FALSE: Final = b"\x00"
_EMPTY_ARRAY: Final = b"\x00"
_DOUBLE: Final = struct.Struct("<d").pack


class NotWritable(Exception):
    """This writer does not write the value (or schema): fastavro does, same bytes or error."""


def long_bytes(value: int) -> bytes:
    """An Avro `long`: zig-zag, then a little-endian base-128 varint."""
    if not LONG_MIN <= value <= LONG_MAX:
        raise NotWritable("long out of range")
    n = (value << 1) ^ (value >> 63)
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n > 127:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def record_writer(parsed: dict[str, object]) -> Callable[[object], bytes]:
    """The writer of records of the parsed record schema `parsed` (module docstring)."""
    named = parsed.get("__named_schemas", {})
    assert isinstance(named, dict)
    write = _record(parsed, _Named(named))

    def encode(record: object) -> bytes:
        parts: Parts = []
        write(parts, record)
        return b"".join(parts)

    return encode


class _Named:
    """The named record schemas of one top-level schema, and the writers built for them
    (one per name: a record that holds itself through a union reuses its own)."""

    def __init__(self, schemas: dict[str, object]) -> None:
        self.schemas = schemas
        self.built: dict[str, _Write] = {}


def kind_of(schema: object, named: dict[str, object]) -> tuple[str, object]:
    """What the parsed `schema` is, for a writer or a reader built from it: `("record", its
    schema)` (a name in `named` resolved), `("primitive", its name)`, `("union", its
    branches)`, `("array", its items)`, or `("other", schema)`: a map, enum or fixed."""
    if isinstance(schema, str):
        return ("record", named[schema]) if schema in named else ("primitive", schema)
    if isinstance(schema, list):
        return "union", schema
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "record":
            return "record", schema
        if kind == "array":
            return "array", schema["items"]
        if isinstance(kind, str) and kind not in ("map", "enum", "fixed"):
            return kind_of(kind, named)
    return "other", schema


def _writer(schema: object, named: _Named) -> _Write:
    kind, part = kind_of(schema, named.schemas)
    if kind == "record":
        return _record(part, named)
    if kind == "primitive" and isinstance(part, str):
        return _primitive(part)
    if kind == "union" and isinstance(part, list):
        return _union(part, named)
    if kind == "array":
        return _array(_writer(part, named))
    raise NotWritable(f"schema {schema!r}")


def _primitive(kind: str) -> _Write:
    if kind == "string":
        return _write_string
    if kind == "long":
        return _write_long
    if kind == "boolean":
        return _write_boolean
    if kind == "null":
        return _write_null
    if kind == "double":
        return _write_double
    if kind == "bytes":
        return _write_bytes
    raise NotWritable(f"type {kind!r}")


def _write_string(parts: Parts, value: object) -> None:
    if type(value) is not str:
        raise NotWritable("string")
    data = value.encode()
    parts.append(long_bytes(len(data)))
    parts.append(data)


def _write_long(parts: Parts, value: object) -> None:
    if type(value) is not int:
        raise NotWritable("long")
    parts.append(long_bytes(value))


def _write_boolean(parts: Parts, value: object) -> None:
    if type(value) is not bool:
        raise NotWritable("boolean")
    parts.append(_TRUE if value else _FALSE)


def _write_null(parts: Parts, value: object) -> None:
    if value is not None:
        raise NotWritable("null")


def _write_double(parts: Parts, value: object) -> None:
    if type(value) is not float:
        raise NotWritable("double")
    parts.append(_DOUBLE(value))


def _write_bytes(parts: Parts, value: object) -> None:
    if type(value) is not bytes:
        raise NotWritable("bytes")
    parts.append(long_bytes(len(value)))
    parts.append(value)


def _record(schema: object, named: _Named) -> _Write:
    """A record's writer: generated source, one straight-line statement group per field (as
    `convert.plan_for` and `dataclasses` generate theirs), the common field types written
    inline, the others through their own writers. Several times fewer instructions than a
    call per field."""
    assert isinstance(schema, dict)
    full_name = str(schema["name"])
    if full_name in named.built:
        return named.built[full_name]
    fields = schema["fields"]
    assert isinstance(fields, list)
    class_name = full_name.rsplit(".", 1)[-1]
    # Bound late: a record may hold itself (through a union), so its fields' writers are
    # built after its own is known.
    namespace: dict[str, object] = {"NotWritable": NotWritable, "_long": long_bytes, "_SMALL": _SMALL,
                                    "_TRUE": _TRUE, "_FALSE": _FALSE, "_CLASS": class_name}
    lines = ["def write(parts, value):",
             "    if type(value).__name__ != _CLASS:",
             "        raise NotWritable('not a ' + _CLASS)"]
    deferred: list[tuple[str, object]] = []
    for index, field in enumerate(fields):
        name = str(field["name"])
        if not name.isidentifier() or name.startswith("__"):
            raise NotWritable(f"field name {name!r}")
        local = f"f{index}"
        lines.append(f"    {local} = value.{name}")
        lines.extend("    " + line for line in _inline(field["type"], local, f"_w{index}", deferred, index))
    exec(compile("\n".join(lines) + "\n", f"<torpor avro writer {class_name}>", "exec"), namespace)
    write = typing.cast(_Write, namespace["write"])
    named.built[full_name] = write
    for writer_name, field_schema in deferred:
        namespace[writer_name] = _writer(field_schema, named)
    return write


def _inline(schema: object, local: str, writer_name: str, deferred: list[tuple[str, object]],
            index: int) -> list[str]:
    """Statements writing `local` (a field's value) of type `schema` to `parts`."""
    if schema == "string":
        return [f"if type({local}) is not str:", "    raise NotWritable('string')",
                f"d{index} = {local}.encode()", f"n{index} = len(d{index})",
                f"parts.append(_SMALL[n{index} << 1] if n{index} < 64 else _long(n{index}))",
                f"parts.append(d{index})"]
    if schema == "long":
        return [f"if type({local}) is not int:", "    raise NotWritable('long')",
                f"parts.append(_SMALL[{local} << 1] if 0 <= {local} < 64 else _long({local}))"]
    if schema == "boolean":
        return [f"if type({local}) is not bool:", "    raise NotWritable('boolean')",
                f"parts.append(_TRUE if {local} else _FALSE)"]
    if isinstance(schema, list) and len(schema) == 2 and "null" in schema and (
            schema[1 - schema.index("null")] in ("string", "long")):
        null_tag, tag = long_bytes(schema.index("null")), long_bytes(1 - schema.index("null"))
        inner = _inline(schema[1 - schema.index("null")], local, writer_name, deferred, index)
        return [f"if {local} is None:", f"    parts.append({null_tag!r})", "else:",
                f"    parts.append({tag!r})", *("    " + line for line in inner)]
    deferred.append((writer_name, schema))
    return [f"{writer_name}(parts, {local})"]


def _array(item: _Write) -> _Write:
    def write(parts: Parts, value: object) -> None:
        if type(value) is not tuple and type(value) is not list:
            raise NotWritable("array")
        if value:
            parts.append(long_bytes(len(value)))
            for element in value:
                item(parts, element)
        parts.append(_EMPTY_ARRAY)

    return write


def _union(branches: list[object], named: _Named) -> _Write:
    null_index = branches.index("null") if "null" in branches else None
    others = [(i, b) for i, b in enumerate(branches) if b != "null"]
    if len(others) == 1:
        index, branch = others[0]
        inner = _writer(branch, named)
        tag = long_bytes(index)
        null_tag = long_bytes(null_index) if null_index is not None else b""

        def write_optional(parts: Parts, value: object) -> None:
            if value is None:
                if null_index is None:
                    raise NotWritable("null in a union without null")
                parts.append(null_tag)
                return
            parts.append(tag)
            inner(parts, value)

        return write_optional
    by_class: dict[str, tuple[bytes, _Write]] = {}
    for index, branch in others:
        name = branch if isinstance(branch, str) else branch.get("name") if isinstance(branch, dict) else None
        if not isinstance(name, str) or (isinstance(branch, str) and branch not in named.schemas):
            raise NotWritable(f"union branch {branch!r}")
        by_class[name.rsplit(".", 1)[-1]] = (long_bytes(index), _writer(branch, named))

    def write_records(parts: Parts, value: object) -> None:
        if value is None:
            if null_index is None:
                raise NotWritable("null in a union without null")
            parts.append(long_bytes(null_index))
            return
        found = by_class.get(type(value).__name__)
        if found is None:
            raise NotWritable(f"{type(value).__name__} is not a branch")
        parts.append(found[0])
        found[1](parts, value)

    return write_records
