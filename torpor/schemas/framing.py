"""The two framings of an Avro value on a Kafka topic, and the schema fingerprint.

A record value on any Torpor topic is a framing header followed by the schemaless Avro
binary body:

- **Single-object encoding** (the Avro specification), used when no Schema Registry is
  configured: ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint of the
  writer schema's Parsing Canonical Form + body.
- **Confluent wire format**, used when a Schema Registry is configured: ``00`` + the
  4-byte big-endian registry schema id + body.

Readers accept both on the same topic; the first byte tells them apart (``C3`` versus
``00``). `unframe` returns which header it found and where the body starts, and raises
`DecodeError` (naming topic, partition and offset) for anything else: an empty or
truncated header, or an unknown magic byte. It never looks at the body.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from torpor.schemas.errors import DecodeError
from torpor.schemas.frozen import fast_inits

SINGLE_OBJECT_MAGIC: Final = b"\xc3\x01"
CONFLUENT_MAGIC: Final = b"\x00"
SINGLE_OBJECT_HEADER_LEN: Final = 10  # 2 magic bytes + 8 fingerprint bytes
CONFLUENT_HEADER_LEN: Final = 5  # 1 magic byte + 4 schema id bytes

# CRC-64-AVRO (the Rabin fingerprint of the Avro specification, "Schema Fingerprints").
_EMPTY64: Final = 0xC15D213AA4D7A795


def _fingerprint_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY64 & -(fp & 1))
        table.append(fp)
    return tuple(table)


_FP_TABLE: Final = _fingerprint_table()


def crc64_avro(data: bytes) -> bytes:
    """The CRC-64-AVRO fingerprint of `data`, as the 8 little-endian bytes of the header.

    `data` is a schema's Parsing Canonical Form as UTF-8; the result is what Java's
    `SchemaNormalization.parsingFingerprint64` computes, in single-object byte order.
    """
    fp = _EMPTY64
    for byte in data:
        fp = (fp >> 8) ^ _FP_TABLE[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


_PRIMITIVES: Final = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_CANONICAL_KEYS: Final = ("name", "type", "fields", "symbols", "items", "values", "size")


def parsing_canonical_form(schema: object, *, logical_as_object: bool = False) -> str:
    """The Parsing Canonical Form of `schema` (Avro specification), as compact JSON.

    With `logical_as_object`, a primitive with a logical type is written
    ``{"type":"long"}`` instead of ``"long"``. That is not the specification (Java,
    fastavro and this function by default write ``"long"``), but some libraries do it
    (Apache Avro for Python 1.12, goavro), so their fingerprints of a schema with
    timestamps differ; readers also accept that variant's fingerprint.
    """
    return _pcf(schema, "", logical_as_object)


def _full(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _pcf(node: object, namespace: str, logical_as_object: bool) -> str:
    if isinstance(node, str):
        return json.dumps(node if node in _PRIMITIVES else _full(node, namespace))
    if isinstance(node, list):
        return "[" + ",".join(_pcf(n, namespace, logical_as_object) for n in node) + "]"
    if not isinstance(node, dict):
        raise ValueError(f"not an Avro schema: {node!r}")
    kind = node["type"]
    if isinstance(kind, str) and kind in _PRIMITIVES:
        if logical_as_object and "logicalType" in node:
            return '{"type":' + json.dumps(kind) + "}"
        return json.dumps(kind)
    if not isinstance(kind, str):
        return _pcf(kind, namespace, logical_as_object)
    if "name" in node:
        full = _full(str(node["name"]), str(node.get("namespace", namespace)))
        namespace = full.rpartition(".")[0]
    parts = []
    for key in _CANONICAL_KEYS:
        if key not in node:
            continue
        value = node[key]
        if key == "name":
            text = json.dumps(full)
        elif key == "fields":
            assert isinstance(value, list)
            text = (
                "["
                + ",".join(
                    '{"name":'
                    + json.dumps(f["name"])
                    + ',"type":'
                    + _pcf(f["type"], namespace, logical_as_object)
                    + "}"
                    for f in value
                )
                + "]"
            )
        elif key in ("items", "values"):
            text = _pcf(value, namespace, logical_as_object)
        else:
            text = json.dumps(value, separators=(",", ":"))
        parts.append(json.dumps(key) + ":" + text)
    return "{" + ",".join(parts) + "}"


@dataclass(frozen=True, slots=True)
class SingleObjectFrame:
    """A single-object header: the writer schema's fingerprint (8 little-endian bytes)."""

    fingerprint: bytes

    @property
    def body_offset(self) -> int:
        return SINGLE_OBJECT_HEADER_LEN


@dataclass(frozen=True, slots=True)
class ConfluentFrame:
    """A Confluent wire-format header: the registry's id of the writer schema."""

    schema_id: int

    @property
    def body_offset(self) -> int:
        return CONFLUENT_HEADER_LEN


Frame = SingleObjectFrame | ConfluentFrame


def single_object_header(fingerprint: bytes) -> bytes:
    """The header of a single-object encoded value whose writer schema has `fingerprint`."""
    if len(fingerprint) != 8:
        raise ValueError(f"a CRC-64-AVRO fingerprint is 8 bytes, got {len(fingerprint)}")
    return SINGLE_OBJECT_MAGIC + fingerprint


def confluent_header(schema_id: int) -> bytes:
    """The header of a Confluent wire-format value written with registry schema `schema_id`."""
    return CONFLUENT_MAGIC + schema_id.to_bytes(4, "big", signed=False)


def unframe(
    data: bytes,
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
) -> Frame:
    """Read the framing header of `data`.

    Returns a `SingleObjectFrame` or a `ConfluentFrame`; the body is
    ``data[frame.body_offset:]``. Raises `DecodeError` naming `topic`, `partition` and
    `offset` when `data` is empty, its header is truncated, or it starts with neither
    magic.
    """
    if data[:2] == SINGLE_OBJECT_MAGIC:
        if len(data) < SINGLE_OBJECT_HEADER_LEN:
            raise DecodeError(
                f"truncated single-object header ({len(data)} bytes, need {SINGLE_OBJECT_HEADER_LEN})",
                topic=topic,
                partition=partition,
                offset=offset,
            )
        return SingleObjectFrame(bytes(data[2:SINGLE_OBJECT_HEADER_LEN]))
    if data[:1] == CONFLUENT_MAGIC:
        if len(data) < CONFLUENT_HEADER_LEN:
            raise DecodeError(
                f"truncated Confluent header ({len(data)} bytes, need {CONFLUENT_HEADER_LEN})",
                topic=topic,
                partition=partition,
                offset=offset,
            )
        return ConfluentFrame(int.from_bytes(data[1:CONFLUENT_HEADER_LEN], "big", signed=False))
    if not data:
        cause = "empty value (a tombstone where a record was expected?)"
    else:
        cause = f"unknown magic bytes {bytes(data[:2]).hex()} (expected c301 or 00)"
    raise DecodeError(cause, topic=topic, partition=partition, offset=offset)


# Built per input or per completion: a faster __init__, same signature (torpor.schemas.frozen).
fast_inits(__name__)
