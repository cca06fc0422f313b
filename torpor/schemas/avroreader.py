"""Avro binary decoding of Torpor's records, read straight into the dataclasses.

`record_reader(parsed, cls)` turns a parsed record schema (fastavro's form, as the codec
holds it) and its record class into a function `read(data, pos) -> (record, end)`: the
record fastavro's `schemaless_reader` followed by `convert.plan_for(cls).from_avro` gives
for the same bytes, without the intermediate dict and without fastavro walking the schema
again for every record (which took 13.3 us per input of the bench workload's mix). Like
the writers (`avrowriter`), the readers are objects of this module's compiled classes, a
record's reader walking its list of fields: a `Receipt` in 2.3 us, where the Python
source generated per record class before stop 30 took 5.2 (`python -m bench.codecs`).

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
    return _record(parsed, cls, _Named(named, _classes_of(cls))).read


class _Named:
    """The named schemas and record classes of one top-level schema, and the readers built
    for them (one per name, shared by every field of that type)."""

    def __init__(self, schemas: dict[str, object], classes: dict[str, type]) -> None:
        self.schemas = schemas
        self.classes = classes
        self.built: dict[str, _Reader] = {}
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


class _Reader:
    """Reads a value of one schema at a position: `(value, the position after it)`."""

    def read(self, data: bytes, pos: int) -> tuple[object, int]:
        raise NotImplementedError


def _reader(schema: object, named: _Named) -> _Reader:
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
        return _Array(_reader(part, named))
    raise NotReadable(f"schema {schema!r}")


def _is_record(schema: object, named: _Named) -> bool:
    return kind_of(schema, named.schemas)[0] == "record"


def _takes_a_byte(schema: object, named: _Named, seen: set[str]) -> bool:
    """Whether every value of `schema` is at least one byte long (what `_Array` relies on)."""
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


def _primitive(kind: str) -> _Reader:
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


def _read_string(data: bytes, pos: int) -> tuple[str, int]:
    n, pos = _length(data, pos)
    try:
        return data[pos:pos + n].decode("utf-8"), pos + n
    except UnicodeDecodeError:
        raise NotReadable("not UTF-8") from None


class _String(_Reader):
    def read(self, data: bytes, pos: int) -> tuple[object, int]:
        return _read_string(data, pos)


class _Long(_Reader):
    def read(self, data: bytes, pos: int) -> tuple[object, int]:
        return read_long(data, pos)


class _Bytes(_Reader):
    def read(self, data: bytes, pos: int) -> tuple[object, int]:
        n, pos = _length(data, pos)
        return bytes(data[pos:pos + n]), pos + n


class _Boolean(_Reader):
    def read(self, data: bytes, pos: int) -> tuple[object, int]:
        if pos >= len(data) or data[pos] > 1:
            raise NotReadable("boolean")
        return data[pos] == 1, pos + 1


class _Null(_Reader):
    def read(self, data: bytes, pos: int) -> tuple[object, int]:
        return None, pos


class _Double(_Reader):
    def read(self, data: bytes, pos: int) -> tuple[object, int]:
        if pos + 8 > len(data):
            raise NotReadable("truncated double")
        return _DOUBLE(data, pos)[0], pos + 8


_PRIMITIVES: Final[dict[str, _Reader]] = {"string": _String(), "long": _Long(), "boolean": _Boolean(),
                                          "null": _Null(), "double": _Double(), "bytes": _Bytes()}

# How a record reads a field: strings and longs (alone or with null) inline, the others
# (`_OTHER`) through the field's own reader.
_OPTIONAL_STRING: Final = 0  # a union of null and string, either order
_OPTIONAL_LONG: Final = 1  # (the two optional kinds first: `_Record.read` tests `<=`)
_STRING: Final = 2
_LONG: Final = 3
_OTHER: Final = 4


class _Field:
    """How one field of a record is read; for a union of null and one type, the bytes
    its two branch indexes are written as (0 and 2: one byte each)."""

    def __init__(self, kind: int, null_byte: int = -1, tag_byte: int = -1,
                 reader: _Reader | None = None) -> None:
        self.kind = kind
        self.null_byte = null_byte
        self.tag_byte = tag_byte
        self.reader = reader


class _Record(_Reader):
    """A record's reader: its fields in order, then the record built from them."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.fields: list[_Field] = []

    def read(self, data: bytes, pos: int) -> tuple[object, int]:
        values: list[object] = []
        for field in self.fields:
            kind = field.kind
            value: object
            if kind <= _OPTIONAL_LONG:
                # Past the end, `data[pos]` raises IndexError: the codec treats it as any
                # other failure here.
                tag = data[pos]
                pos += 1
                if tag == field.null_byte:
                    values.append(None)
                    continue
                if tag != field.tag_byte:
                    raise NotReadable("union index")
                kind = _STRING if kind == _OPTIONAL_STRING else _LONG
            if kind == _STRING:
                value, pos = _read_string(data, pos)
            elif kind == _LONG:
                value, pos = read_long(data, pos)
            else:
                reader = field.reader
                assert reader is not None
                value, pos = reader.read(data, pos)
            values.append(value)
        return self.cls(*values), pos


def _record(schema: object, cls: type | None, named: _Named) -> _Reader:
    assert isinstance(schema, dict)
    full_name = str(schema["name"])
    found = named.built.get(full_name)
    if found is not None:
        return found
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
    record = _Record(record_cls)
    for field in fields:
        record.fields.append(_field(field["type"], named))
    named.building.discard(full_name)
    named.built[full_name] = record
    return record


def _field(schema: object, named: _Named) -> _Field:
    if schema == "string":
        return _Field(_STRING)
    if schema == "long":
        return _Field(_LONG)
    if isinstance(schema, list) and len(schema) == 2 and "null" in schema:
        null_index = schema.index("null")
        other = schema[1 - null_index]
        if other in ("string", "long"):
            kind = _OPTIONAL_STRING if other == "string" else _OPTIONAL_LONG
            return _Field(kind, 2 * null_index, 2 * (1 - null_index))  # zig-zag: 0 and 2
    return _Field(_OTHER, reader=_reader(schema, named))


class _Array(_Reader):
    def __init__(self, item: _Reader) -> None:
        self.item = item

    def read(self, data: bytes, pos: int) -> tuple[object, int]:
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
                value, pos = self.item.read(data, pos)
                items.append(value)


class _Union(_Reader):
    def __init__(self, readers: list[_Reader]) -> None:
        self.readers = readers

    def read(self, data: bytes, pos: int) -> tuple[object, int]:
        index, pos = read_long(data, pos)
        if not 0 <= index < len(self.readers):
            raise NotReadable("union index")
        return self.readers[index].read(data, pos)


def _union(branches: list[object], named: _Named) -> _Reader:
    others = [branch for branch in branches if branch != "null"]
    if len(others) > 1 and not all(_is_record(branch, named) for branch in others):
        raise NotReadable(f"union {branches!r}: only null and one type, or records")
    return _Union([_reader(branch, named) for branch in branches])
