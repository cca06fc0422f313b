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

The writers are objects of this module's classes, which mypyc compiles
(`torpor.native.MODULES`): a record's writer walks its list of fields, strings, longs and
booleans (alone or with null) written inline, the other fields through their own
writers. Compiled, that writes the bench workload's records 2.7-2.9 times faster than
the Python source generated per record class before (`python -m bench.codecs`, stop 30: a
`Receipt` in 1.5 us instead of 4.3); run as Python (`TORPOR_PURE=1`), 1.6-1.8 times
slower than that source.
"""

from __future__ import annotations

import struct
import typing
from collections.abc import Callable, Sequence
from typing import Final

Parts = list[bytes]

LONG_MIN: Final = -(1 << 63)
LONG_MAX: Final = (1 << 63) - 1  # an Avro long's range (fold.calls bounds a timer by it)
_SHORT: Final = 1 << 55  # within it, compiled code does a long's arithmetic in machine words
_SMALL: Final = tuple(bytes((n,)) for n in range(128))  # a varint below 128 is one byte
_TRUE: Final = b"\x01"
_FALSE: Final = b"\x00"
_EMPTY_ARRAY: Final = b"\x00"
_DOUBLE: Final = struct.Struct("<d").pack


class NotWritable(Exception):
    """This writer does not write the value (or schema): fastavro does, same bytes or error."""


def long_bytes(value: int) -> bytes:
    """An Avro `long`: zig-zag, then a little-endian base-128 varint."""
    if not -_SHORT <= value < _SHORT and not LONG_MIN <= value <= LONG_MAX:
        raise NotWritable("long out of range")
    n = (value << 1) ^ (value >> 63)
    if n < 128:
        return _SMALL[n]
    # The 7-bit groups, each with its continuation bit, packed into one integer: for a
    # value below `_SHORT` (a time in ms, an offset) every step is a machine-word
    # operation when compiled, where a bytearray's appends were calls.
    packed = shift = 0
    while n > 127:
        packed |= ((n & 0x7F) | 0x80) << shift
        n >>= 7
        shift += 8
    packed |= n << shift
    return packed.to_bytes((shift >> 3) + 1, "little")


def record_writer(parsed: dict[str, object]) -> Callable[[object], bytes]:
    """The writer of records of the parsed record schema `parsed` (module docstring)."""
    named = parsed.get("__named_schemas", {})
    assert isinstance(named, dict)
    return _Encoder(_record(parsed, _Named(named))).encode


class _Writer:
    """Writes values of one schema to `parts`; raises `NotWritable` for any other value."""

    def write(self, parts: Parts, value: object) -> None:
        raise NotImplementedError


class _Encoder:
    """A top-level record's writer, as a function from the record to its bytes."""

    def __init__(self, writer: _Writer) -> None:
        self.writer = writer

    def encode(self, record: object) -> bytes:
        parts: Parts = []
        self.writer.write(parts, record)
        return b"".join(parts)


class _Named:
    """The named record schemas of one top-level schema, and the writers built for them
    (one per name: a record that holds itself through a union reuses its own)."""

    def __init__(self, schemas: dict[str, object]) -> None:
        self.schemas = schemas
        self.built: dict[str, _Writer] = {}


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


def _writer(schema: object, named: _Named) -> _Writer:
    kind, part = kind_of(schema, named.schemas)
    if kind == "record":
        return _record(part, named)
    if kind == "primitive" and isinstance(part, str):
        return _primitive(part)
    if kind == "union" and isinstance(part, list):
        return _union(part, named)
    if kind == "array":
        return _Array(_writer(part, named))
    raise NotWritable(f"schema {schema!r}")


def _primitive(kind: str) -> _Writer:
    found = _PRIMITIVES.get(kind)
    if found is None:
        raise NotWritable(f"type {kind!r}")
    return found


def _put_string(parts: Parts, value: object) -> None:
    if type(value) is not str:
        raise NotWritable("string")
    data = value.encode()
    n = len(data)
    parts.append(_SMALL[n << 1] if n < 64 else long_bytes(n))
    parts.append(data)


def _put_long(parts: Parts, value: object) -> None:
    if type(value) is not int:
        raise NotWritable("long")
    parts.append(_SMALL[value << 1] if 0 <= value < 64 else long_bytes(value))


def _put_boolean(parts: Parts, value: object) -> None:
    if type(value) is not bool:
        raise NotWritable("boolean")
    parts.append(_TRUE if value else _FALSE)


class _String(_Writer):
    def write(self, parts: Parts, value: object) -> None:
        _put_string(parts, value)


class _Long(_Writer):
    def write(self, parts: Parts, value: object) -> None:
        _put_long(parts, value)


class _Boolean(_Writer):
    def write(self, parts: Parts, value: object) -> None:
        _put_boolean(parts, value)


class _Null(_Writer):
    def write(self, parts: Parts, value: object) -> None:
        if value is not None:
            raise NotWritable("null")


class _Double(_Writer):
    def write(self, parts: Parts, value: object) -> None:
        if type(value) is not float:
            raise NotWritable("double")
        parts.append(_DOUBLE(value))


class _Bytes(_Writer):
    def write(self, parts: Parts, value: object) -> None:
        if type(value) is not bytes:
            raise NotWritable("bytes")
        parts.append(long_bytes(len(value)))
        parts.append(value)


_PRIMITIVES: Final[dict[str, _Writer]] = {"string": _String(), "long": _Long(), "boolean": _Boolean(),
                                          "null": _Null(), "double": _Double(), "bytes": _Bytes()}

# How a record writes a field: the common types inline (no call through a writer), the
# others (`_OTHER`) through the field's own writer.
_STRING: Final = 0
_LONG: Final = 1
_BOOLEAN: Final = 2
_OPTIONAL_STRING: Final = 3  # a union of null and string, either order
_OPTIONAL_LONG: Final = 4
_OTHER: Final = 5


class _Field:
    """One field of a record: its name, how it is written, and for a union of null and
    one type, the two branch indexes' bytes."""

    def __init__(self, name: str, kind: int, null_tag: bytes = b"", tag: bytes = b"",
                 writer: _Writer | None = None) -> None:
        self.name = name
        self.kind = kind
        self.null_tag = null_tag
        self.tag = tag
        self.writer = writer


class _Record(_Writer):
    """A record's writer: its fields in order, a class of the schema's name only (the
    codec finds schemas by class name, so another shape fails here, not as garbage)."""

    def __init__(self, class_name: str) -> None:
        self.class_name = class_name
        self.fields: list[_Field] = []  # filled once built: a record may hold itself

    def write(self, parts: Parts, value: object) -> None:
        if type(value).__name__ != self.class_name:
            raise NotWritable("not a " + self.class_name)
        for field in self.fields:
            item = getattr(value, field.name)
            kind = field.kind
            if kind == _STRING:
                _put_string(parts, item)
            elif kind == _LONG:
                _put_long(parts, item)
            elif kind == _BOOLEAN:
                _put_boolean(parts, item)
            elif item is None and kind != _OTHER:  # an optional string or long
                parts.append(field.null_tag)
            elif kind == _OPTIONAL_STRING:
                parts.append(field.tag)
                _put_string(parts, item)
            elif kind == _OPTIONAL_LONG:
                parts.append(field.tag)
                _put_long(parts, item)
            else:
                writer = field.writer
                assert writer is not None
                writer.write(parts, item)


_INLINE: Final = {"string": _STRING, "long": _LONG, "boolean": _BOOLEAN}
_INLINE_OPTIONAL: Final = {"string": _OPTIONAL_STRING, "long": _OPTIONAL_LONG}


def _record(schema: object, named: _Named) -> _Writer:
    assert isinstance(schema, dict)
    full_name = str(schema["name"])
    found = named.built.get(full_name)
    if found is not None:
        return found
    fields = schema["fields"]
    assert isinstance(fields, list)
    record = _Record(full_name.rsplit(".", 1)[-1])
    named.built[full_name] = record  # before its fields: one may hold this record
    for field in fields:
        record.fields.append(_field(str(field["name"]), field["type"], named))
    return record


def _field(name: str, schema: object, named: _Named) -> _Field:
    if not name.isidentifier() or name.startswith("__"):
        raise NotWritable(f"field name {name!r}")
    if isinstance(schema, str) and schema in _INLINE:
        return _Field(name, _INLINE[schema])
    if isinstance(schema, list) and len(schema) == 2 and "null" in schema:
        null_index = schema.index("null")
        other = schema[1 - null_index]
        if isinstance(other, str) and other in _INLINE_OPTIONAL:
            return _Field(name, _INLINE_OPTIONAL[other], long_bytes(null_index), long_bytes(1 - null_index))
    return _Field(name, _OTHER, writer=_writer(schema, named))


class _Array(_Writer):
    def __init__(self, item: _Writer) -> None:
        self.item = item

    def write(self, parts: Parts, value: object) -> None:
        if type(value) is not tuple and type(value) is not list:
            raise NotWritable("array")
        items = typing.cast(Sequence[object], value)
        if items:
            parts.append(long_bytes(len(items)))
            for element in items:
                self.item.write(parts, element)
        parts.append(_EMPTY_ARRAY)


def _put_null(parts: Parts, null_tag: bytes | None) -> None:
    """A union's null: its branch index, if it has one."""
    if null_tag is None:
        raise NotWritable("null in a union without null")
    parts.append(null_tag)


class _Optional(_Writer):
    """A union of one type and perhaps null."""

    def __init__(self, inner: _Writer, tag: bytes, null_tag: bytes | None) -> None:
        self.inner = inner
        self.tag = tag
        self.null_tag = null_tag

    def write(self, parts: Parts, value: object) -> None:
        if value is None:
            _put_null(parts, self.null_tag)
            return
        parts.append(self.tag)
        self.inner.write(parts, value)


class _Records(_Writer):
    """A union of records (and perhaps null), the branch chosen by the value's class name."""

    def __init__(self, by_class: dict[str, tuple[bytes, _Writer]], null_tag: bytes | None) -> None:
        self.by_class = by_class
        self.null_tag = null_tag

    def write(self, parts: Parts, value: object) -> None:
        if value is None:
            _put_null(parts, self.null_tag)
            return
        found = self.by_class.get(type(value).__name__)
        if found is None:
            raise NotWritable(f"{type(value).__name__} is not a branch")
        parts.append(found[0])
        found[1].write(parts, value)


def _union(branches: list[object], named: _Named) -> _Writer:
    null_tag = long_bytes(branches.index("null")) if "null" in branches else None
    others = [(i, b) for i, b in enumerate(branches) if b != "null"]
    if len(others) == 1:
        index, branch = others[0]
        return _Optional(_writer(branch, named), long_bytes(index), null_tag)
    by_class: dict[str, tuple[bytes, _Writer]] = {}
    for index, branch in others:
        name = branch if isinstance(branch, str) else branch.get("name") if isinstance(branch, dict) else None
        if not isinstance(name, str) or (isinstance(branch, str) and branch not in named.schemas):
            raise NotWritable(f"union branch {branch!r}")
        by_class[name.rsplit(".", 1)[-1]] = (long_bytes(index), _writer(branch, named))
    return _Records(by_class, null_tag)
