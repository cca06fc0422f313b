"""Avro binary decoding of Torpor's records, read straight into the dataclasses.

`record_reader(parsed, cls)` turns a parsed record schema (fastavro's form, as the codec
holds it) and its record class into a function `read(data, pos) -> (record, end)`: the
record fastavro's `schemaless_reader` followed by `convert.plan_for(cls).from_avro` gives
for the same bytes, without the intermediate dict and without fastavro walking the schema
again for every record: 6.2 us per input of the bench workload's mix instead of 13.3.

It reads only bytes written with this very schema (the codec calls it when the writer's
fingerprint is the reader's) and only the subset `avrowriter` writes: records, arrays,
`null`, `boolean`, `long`, `double`, `string`, `bytes`, a union of `null` and one type,
and a union of records; no record that holds itself (its nesting would be the body's to
choose). Anything it does not read exactly as fastavro would raises
`NotReadable`, and so does every malformed input: a truncated body, a negative length, a
varint longer than ten bytes or past 64 bits, a union index out of range, a boolean byte
other than 0 or 1, a negative (sized) array block, text that is not UTF-8, an array that
claims more items than bytes remain (the work stays bounded by the input's size). Any
exception it raises, `NotReadable` or one from a record's `__post_init__`, sends the codec
to fastavro's path, which gives the record or the `DecodeError` it always gave: a value
comes from here only when the bytes are well formed, by construction the same value.
`record_reader` raises `NotReadable` for a schema or class outside that subset.
"""

from __future__ import annotations

import dataclasses
import struct
import sys
import types
import typing
from collections.abc import Callable
from typing import Final

from torpor.schemas.avrowriter import kind_of

Read = Callable[[bytes, int], tuple[object, int]]

_DOUBLE: Final = struct.Struct("<d").unpack_from
_VARINT_BYTES: Final = 10  # a 64-bit value in base 128


class NotReadable(Exception):
    """This reader does not read the bytes (or schema): fastavro does, same value or error."""


def read_long(data: bytes, pos: int) -> tuple[int, int]:
    """An Avro `long` at `pos` (zig-zag, base-128 varint) and the position after it.
    Past the end of `data`: IndexError."""
    byte = data[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    n, shift, end = byte & 0x7F, 7, pos + _VARINT_BYTES
    pos += 1
    while True:
        byte = data[pos]
        n |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            break
        if pos == end:
            raise NotReadable("a long of more than ten bytes")
        shift += 7
    if n >> 64:
        raise NotReadable("a long past 64 bits")
    return (n >> 1) ^ -(n & 1), pos


def record_reader(parsed: dict[str, object], cls: type) -> Read:
    """The reader of records of `cls` under the parsed record schema `parsed` (module docstring)."""
    named = parsed.get("__named_schemas", {})
    assert isinstance(named, dict)
    return _record(parsed, cls, _Named(named, _classes_of(cls)))


class _Named:
    """The named schemas and record classes of one top-level schema, and the readers built
    for them (one per name, shared by every field of that type)."""

    def __init__(self, schemas: dict[str, object], classes: dict[str, type]) -> None:
        self.schemas = schemas
        self.classes = classes
        self.built: dict[str, Read] = {}
        self.building: set[str] = set()  # the records whose fields are being read


def _classes_of(cls: type) -> dict[str, type]:
    """Every record class reachable from `cls`'s field types, by its Avro full name."""
    found: dict[str, type] = {}

    def visit(tp: object) -> None:
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            name = f"torpor.{tp.__name__}"
            if name in found:
                if found[name] is not tp:  # the schema names one record where there are two
                    raise NotReadable(f"two record classes are named {name}")
                return
            found[name] = tp
            hints = typing.get_type_hints(tp, vars(sys.modules[tp.__module__]))
            for field in dataclasses.fields(tp):
                visit(hints[field.name])
        elif isinstance(tp, types.UnionType) or typing.get_origin(tp) in (typing.Union, tuple):
            for arg in typing.get_args(tp):
                visit(arg)

    visit(cls)
    return found


def _reader(schema: object, named: _Named) -> Read:
    kind, part = kind_of(schema, named.schemas)
    if kind == "record":
        return _record(part, None, named)
    if kind == "primitive" and isinstance(part, str):
        return _primitive(part)
    if kind == "union" and isinstance(part, list):
        return _union(part, named)
    if kind == "array":
        if not _takes_a_byte(part, named, set()):
            raise NotReadable(f"array of {part!r}: an item may take no bytes")
        return _array(_reader(part, named))
    raise NotReadable(f"schema {schema!r}")


def _is_record(schema: object, named: _Named) -> bool:
    return kind_of(schema, named.schemas)[0] == "record"


def _takes_a_byte(schema: object, named: _Named, seen: set[str]) -> bool:
    """Whether every value of `schema` is at least one byte long (what `_array` relies on)."""
    kind, part = kind_of(schema, named.schemas)
    if kind == "primitive":
        return part != "null"
    if kind == "record" and isinstance(part, dict):
        name = str(part["name"])
        if name in seen:  # a record inside itself: its other fields decide
            return False
        fields = part["fields"]
        assert isinstance(fields, list)
        return any(_takes_a_byte(f["type"], named, seen | {name}) for f in fields)
    return kind in ("union", "array")  # a branch index; the block count that ends an array


def _primitive(kind: str) -> Read:
    found = _PRIMITIVES.get(kind)
    if found is None:
        raise NotReadable(f"type {kind!r}")
    return found


def _length(data: bytes, pos: int) -> tuple[int, int]:
    """A length (of a string or bytes) and where its content starts; it must fit in `data`."""
    n, pos = read_long(data, pos)
    if n < 0 or pos + n > len(data):
        raise NotReadable("bad length")
    return n, pos


def _read_string(data: bytes, pos: int) -> tuple[object, int]:
    n, pos = _length(data, pos)
    try:
        return str(data[pos:pos + n], "utf-8"), pos + n
    except UnicodeDecodeError:
        raise NotReadable("not UTF-8") from None


def _read_bytes(data: bytes, pos: int) -> tuple[object, int]:
    n, pos = _length(data, pos)
    return bytes(data[pos:pos + n]), pos + n


def _read_boolean(data: bytes, pos: int) -> tuple[object, int]:
    if pos >= len(data) or data[pos] > 1:
        raise NotReadable("boolean")
    return data[pos] == 1, pos + 1


def _read_null(data: bytes, pos: int) -> tuple[object, int]:
    return None, pos


def _read_double(data: bytes, pos: int) -> tuple[object, int]:
    if pos + 8 > len(data):
        raise NotReadable("truncated double")
    return _DOUBLE(data, pos)[0], pos + 8


_PRIMITIVES: Final[dict[str, Read]] = {"string": _read_string, "long": read_long, "boolean": _read_boolean,
                                       "null": _read_null, "double": _read_double, "bytes": _read_bytes}


def _record(schema: object, cls: type | None, named: _Named) -> Read:
    """A record's reader: generated source, one statement group per field (as `avrowriter`
    writes them), strings and longs read inline, the others through their own readers."""
    assert isinstance(schema, dict)
    full_name = str(schema["name"])
    if full_name in named.built:
        return named.built[full_name]
    if full_name in named.building:
        # A record that holds itself: a hostile body could nest it until Python's stack
        # ran out, here or in fastavro (which crashes the process at some thousands of
        # levels). None of the shipped schemas does; one that did must bound its depth first.
        raise NotReadable(f"{full_name} holds itself")
    named.building.add(full_name)
    record_cls = cls if cls is not None else named.classes.get(full_name)
    if record_cls is None or f"torpor.{record_cls.__name__}" != full_name:
        raise NotReadable(f"no record class for {full_name}")
    fields = schema["fields"]
    assert isinstance(fields, list)
    if [str(f["name"]) for f in fields] != [f.name for f in dataclasses.fields(record_cls)]:
        raise NotReadable(f"{full_name}: the schema's fields are not the class's")
    namespace: dict[str, object] = {"NotReadable": NotReadable, "_long": read_long, "_cls": record_cls,
                                    "_len": len, "_str": str}
    lines = ["def read(data, pos):", "    size = _len(data)"]
    deferred: list[tuple[str, object]] = []
    for index, field in enumerate(fields):
        lines.extend("    " + line for line in _inline(field["type"], f"f{index}", f"_r{index}", deferred))
    args = ", ".join(f"f{index}" for index in range(len(fields)))
    lines.append(f"    return _cls({args}), pos")
    class_name = full_name.rsplit(".", 1)[-1]
    exec(compile("\n".join(lines) + "\n", f"<torpor avro reader {class_name}>", "exec"), namespace)
    read = typing.cast(Read, namespace["read"])
    for reader_name, field_schema in deferred:
        namespace[reader_name] = _reader(field_schema, named)
    named.building.discard(full_name)
    named.built[full_name] = read
    return read


def _inline(schema: object, local: str, reader_name: str, deferred: list[tuple[str, object]]) -> list[str]:
    """Statements reading a value of type `schema` at `pos` into `local`, advancing `pos`."""
    if schema == "long":
        # One byte holds a value in -64..63: most longs and lengths; `data[pos]` past the
        # end raises IndexError, which the codec treats as any other failure here.
        return ["b = data[pos]", "if b < 128:", f"    {local} = (b >> 1) ^ -(b & 1)", "    pos += 1",
                "else:", f"    {local}, pos = _long(data, pos)"]
    if schema == "string":
        return [*_inline("long", "n", reader_name, deferred),
                "if n < 0 or pos + n > size:", "    raise NotReadable('bad length')",
                f"{local} = _str(data[pos:pos + n], 'utf-8')", "pos += n"]
    if isinstance(schema, list) and len(schema) == 2 and "null" in schema and (
            schema[1 - schema.index("null")] in ("string", "long")):
        null_tag, tag = schema.index("null"), 1 - schema.index("null")
        inner = _inline(schema[tag], local, reader_name, deferred)
        return ["b = data[pos]", "pos += 1", f"if b == {2 * null_tag}:", f"    {local} = None",
                f"elif b == {2 * tag}:", *("    " + line for line in inner),
                "else:", "    raise NotReadable('union index')"]
    deferred.append((reader_name, schema))
    return [f"{local}, pos = {reader_name}(data, pos)"]


def _array(item: Read) -> Read:
    def read(data: bytes, pos: int) -> tuple[object, int]:
        items: list[object] = []
        while True:
            count, pos = read_long(data, pos)
            if count == 0:
                return tuple(items), pos
            # Every item takes at least one byte (no schema here has an item of none):
            # a count past what remains is malformed, and never makes the loop long.
            if count < 0 or count > len(data) - pos:
                raise NotReadable("bad array block")
            for _ in range(count):
                value, pos = item(data, pos)
                items.append(value)

    return read


def _union(branches: list[object], named: _Named) -> Read:
    others = [branch for branch in branches if branch != "null"]
    if len(others) > 1 and not all(_is_record(branch, named) for branch in others):
        raise NotReadable(f"union {branches!r}: only null and one type, or records")
    readers = [_reader(branch, named) for branch in branches]

    def read(data: bytes, pos: int) -> tuple[object, int]:
        index, pos = read_long(data, pos)
        if not 0 <= index < len(readers):
            raise NotReadable("union index")
        return readers[index](data, pos)

    return read
