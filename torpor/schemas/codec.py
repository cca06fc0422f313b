"""Encode and decode the records of `records.py` under the schemas in `schemas/*.avsc`.

Contract:

- `canonical_bytes(record) -> bytes`: the schemaless Avro binary encoding of `record`
  under its current schema, no framing. Avro binary is deterministic for a given schema
  and value, so these bytes are what the history hash chain and the signing rule are
  computed over. (They change when a hashed record's schema gains a field; a replay
  recomputes the chain under the schemas of its build.)
- `encode_value(record) -> bytes` / `decode_value(data, cls, ...)`: the no-registry
  path. Values are written in single-object encoding (``C3 01`` + CRC-64-AVRO
  fingerprint + body). Reading resolves the writer schema, found by its fingerprint
  among the schemas this build holds (the current ones and `schemas/history/*.avsc`),
  to the reader schema of `cls`. The specification's fingerprint is written; the variant
  some libraries compute (logical types kept in the canonical form) is accepted too.
- `Codec(registry, catalog)`: configured once. With a `SchemaRegistry` it writes the
  Confluent wire format, registering each schema under subject ``<topic>-value``;
  without one it writes single-object encoding. It reads both framings in either
  configuration (Confluent-framed values need a registry to be read). `catalog`
  defaults to the shipped schemas (`shipped_catalog()`).

Schema files: one self-contained file per top-level record (`TOP_LEVEL`); each defines
every named type it uses at its first use, so any Avro library parses any file alone.
Nested records (`TextBlock`, `Capability`, ...) get a standalone schema derived from
their definition, so `canonical_bytes` and framing work for them as well.

Every decoding failure raises `DecodeError` naming topic, partition, offset and the
cause: bad framing, an unknown fingerprint or schema id, truncated or trailing bytes, a
union branch the reader does not know, or a writer schema that cannot be resolved to the
reader's. Encoding a record that does not fit its schema raises `ContractError` (a bug in
the producer, not a condition to retry). Using a class whose fields differ from the
schema of its name raises `SchemaMismatchError` on first use, encoding or decoding.

Timestamps: the schemas mark ms times as ``timestamp-millis`` for other languages. The
codec parses its schemas with logical types removed, so times stay plain `int` ms, as
`records.py` declares them; the bytes and fingerprints are the same (Parsing Canonical
Form drops logical types). Schema evolution must be backward and forward compatible;
`tests/schemas/test_evolution.py` checks it and pins the current fingerprints.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Final, TypeVar

import fastavro

from torpor.schemas import framing
from torpor.schemas.avroreader import record_reader
from torpor.schemas.avrowriter import NotWritable, record_writer
from torpor.schemas.convert import NAMESPACE, RecordPlan, plan_for
from torpor.schemas.errors import ContractError, DecodeError, SchemaMismatchError
from torpor.schemas.frozen import fast_inits
from torpor.schemas.registry import SchemaRegistry

T = TypeVar("T")

TOP_LEVEL: Final = ("Input", "Dispatch", "ThreadEvent", "Receipt", "HistoryEntry")
"""The self-contained schema files, one per top-level record: ``schemas/<Name>.avsc``."""

HISTORY_DIR: Final = "history"
"""Older versions of the top-level schemas, kept so their fingerprints stay readable."""


@dataclass(frozen=True, slots=True)
class KnownSchema:
    """One Avro record schema this build can write or read.

    `schema` is the schema as shipped (self-contained, with docs and logical types),
    `text` its JSON (what is registered), `fingerprint` the CRC-64-AVRO of its Parsing
    Canonical Form (8 little-endian bytes; what this build writes), and `parsed` the
    fastavro form the codec uses (logical types removed). `also_known_as` holds the
    fingerprint that libraries keeping logical types in the canonical form compute
    (see `framing.parsing_canonical_form`), when it differs: readers accept it too.
    """

    name: str
    schema: dict[str, object]
    text: str
    fingerprint: bytes
    parsed: dict[str, object]
    also_known_as: tuple[bytes, ...] = ()


def _strip_logical(schema: object) -> object:
    """`schema` without logical types or docs: what the codec reads and writes with."""
    if isinstance(schema, list):
        return [_strip_logical(s) for s in schema]
    if isinstance(schema, dict):
        if "logicalType" in schema and isinstance(schema.get("type"), str):
            return schema["type"]
        return {k: _strip_logical(v) for k, v in schema.items() if k != "doc"}
    return schema


def make_known(schema: dict[str, object]) -> KnownSchema:
    """Parse a self-contained record schema into a `KnownSchema`.

    Raises `ContractError` if fastavro rejects the schema.
    """
    try:
        canonical = framing.parsing_canonical_form(schema)
        variant = framing.parsing_canonical_form(schema, logical_as_object=True)
        parsed = fastavro.parse_schema(
            typing.cast(dict[str, object], _strip_logical(schema)), named_schemas={}
        )
    except Exception as exc:  # fastavro raises several unrelated types for a bad schema
        raise ContractError(f"invalid Avro schema {schema.get('name')!r}: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ContractError(f"schema {schema.get('name')!r} is not a record schema")
    name = str(schema["name"])
    full = name if "." in name else f"{schema.get('namespace', NAMESPACE)}.{name}"
    return KnownSchema(
        name=full,
        schema=schema,
        text=json.dumps(schema, separators=(",", ":")),
        fingerprint=framing.crc64_avro(canonical.encode()),
        parsed=parsed,
        also_known_as=() if variant == canonical else (framing.crc64_avro(variant.encode()),),
    )


def _collect_definitions(schema: object, into: dict[str, dict[str, object]]) -> None:
    """Index every record definition in `schema` by its short name (all are `torpor`)."""
    if isinstance(schema, list):
        for s in schema:
            _collect_definitions(s, into)
    elif isinstance(schema, dict):
        if schema.get("type") == "record":
            into.setdefault(str(schema["name"]), schema)
            fields = schema["fields"]
            assert isinstance(fields, list)
            for f in fields:
                _collect_definitions(f["type"], into)
        elif schema.get("type") == "array":
            _collect_definitions(schema["items"], into)


def _standalone(node: object, defs: Mapping[str, dict[str, object]], seen: set[str]) -> object:
    """`node` with each named record inlined at its first use and referenced by name after."""
    if isinstance(node, str):
        if node in defs and node not in seen:
            return _standalone(defs[node], defs, seen)
        return node
    if isinstance(node, list):
        return [_standalone(n, defs, seen) for n in node]
    if isinstance(node, dict):
        if node.get("type") == "record":
            name = str(node["name"])
            if name in seen:
                return name
            seen.add(name)
            fields = node["fields"]
            assert isinstance(fields, list)
            out = {k: v for k, v in node.items() if k != "fields"}
            out["fields"] = [{**f, "type": _standalone(f["type"], defs, seen)} for f in fields]
            return out
        if node.get("type") == "array":
            return {**node, "items": _standalone(node["items"], defs, seen)}
    return node


def _load_json(path: resources.abc.Traversable) -> dict[str, object]:
    loaded = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(loaded, dict):
        raise ContractError(f"{path.name}: expected a record schema object")
    return loaded


@dataclass(frozen=True, slots=True)
class Catalog:
    """A set of schemas: the reader schemas of a build, and the writer schemas it can read.

    `current` maps each record's short name (every record in the top-level schemas,
    nested ones included) to its current `KnownSchema`: the schema records of the class
    of that name are written with and read into. `by_fingerprint` maps the fingerprint of
    every schema readable as a writer schema (the current ones, older versions, and any
    newer ones rolled out to readers first) to it.
    """

    current: Mapping[str, KnownSchema]
    by_fingerprint: Mapping[bytes, KnownSchema]

    @classmethod
    def from_schemas(
        cls, top_level: Iterable[dict[str, object]], writer_only: Iterable[dict[str, object]] = ()
    ) -> Catalog:
        """A catalog of self-contained `top_level` record schemas plus `writer_only` ones.

        Each named record nested in a top-level schema gets a standalone schema of its own
        (its definition with every record it uses inlined), so `canonical_bytes` works for
        nested records too. Raises `ContractError` if a schema does not parse.
        """
        files = {str(schema["name"]): schema for schema in top_level}
        defs: dict[str, dict[str, object]] = {}
        for schema in files.values():
            _collect_definitions(schema, defs)
        current: dict[str, KnownSchema] = {}
        for name, definition in defs.items():
            if name in files:
                schema = files[name]
            else:
                standalone = _standalone(definition, defs, set())
                assert isinstance(standalone, dict)
                schema = {**standalone, "namespace": NAMESPACE}
            current[name] = make_known(schema)
        return cls(current=current, by_fingerprint={})._with_known(current.values()).with_writers(writer_only)

    def with_writers(self, schemas: Iterable[dict[str, object]]) -> Catalog:
        """This catalog, also able to read values written with `schemas` (self-contained).

        In single-object encoding a reader can resolve only writer schemas it holds: roll
        a new schema out to readers (here, or as a file under `schemas/history/`) before
        any writer uses it. Raises `ContractError` if a schema does not parse.
        """
        return self._with_known([make_known(schema) for schema in schemas])

    def _with_known(self, knowns: Iterable[KnownSchema]) -> Catalog:
        by_fingerprint = dict(self.by_fingerprint)
        for known in knowns:
            for fingerprint in (known.fingerprint, *known.also_known_as):
                # First come, first kept: a current schema is never shadowed by an old one.
                by_fingerprint.setdefault(fingerprint, known)
        return Catalog(current=self.current, by_fingerprint=by_fingerprint)

    def schema_for(self, cls: type) -> KnownSchema:
        """The current schema of record class `cls`. Raises `ContractError` if there is none."""
        try:
            return self.current[cls.__name__]
        except KeyError:
            raise ContractError(f"no Avro schema named {cls.__name__!r} in this catalog") from None


@functools.cache
def shipped_catalog() -> Catalog:
    """The shipped schemas (`schemas/*.avsc`, `schemas/history/*.avsc`), loaded once.

    Raises `ContractError` if a shipped schema is bad (a broken build).
    """
    root = resources.files("torpor.schemas")
    history = root / HISTORY_DIR
    older = (
        [_load_json(p) for p in sorted(history.iterdir(), key=lambda p: p.name) if p.name.endswith(".avsc")]
        if history.is_dir()
        else []
    )
    return Catalog.from_schemas([_load_json(root / f"{name}.avsc") for name in TOP_LEVEL], older)


def schema_for(cls: type) -> KnownSchema:
    """The shipped current schema of record class `cls`. Raises `ContractError` if none."""
    return shipped_catalog().schema_for(cls)


@dataclass(frozen=True, slots=True)
class _ClassCodec:
    """What encoding and decoding one record class needs, computed once per class."""

    plan: RecordPlan
    schema: KnownSchema
    single_object_header: bytes
    # The record's bytes written straight from the dataclass (`avrowriter`), or None where
    # the schema is outside what it writes: then fastavro writes every record of the class.
    direct: Callable[[object], bytes] | None = None
    # The record read straight into the dataclass from bytes of this very schema
    # (`avroreader`), or None where the schema is outside what it reads.
    reader: Callable[[bytes, int], tuple[object, int]] | None = None


def _read_straight(codec: _ClassCodec, data: bytes, start: int, cls: type[T]) -> T | None:
    """The record of `cls` the direct reader reads from ``data[start:]``, or None: no direct
    reader, or bytes it does not read whole (any exception included). The caller's general
    path then reads them with fastavro, and reports what it finds wrong."""
    if codec.reader is None:
        return None
    try:
        value, end = codec.reader(data, start)
    except Exception:
        return None
    return value if end == len(data) and isinstance(value, cls) else None


class Codec:
    """Encoder and decoder for one process, configured once.

    `registry` None: write single-object encoding. A `SchemaRegistry`: write the
    Confluent wire format, registering each record's schema under ``<topic>-value``.
    Either way `decode` reads both framings. `catalog` (default: the shipped schemas)
    gives the reader schemas and the writer schemas known without a registry. Safe to
    share between threads: its caches only grow, with idempotent entries.
    """

    __slots__ = ("_catalog", "_classes", "_headers", "_registry", "_writers")

    def __init__(self, registry: SchemaRegistry | None = None, catalog: Catalog | None = None) -> None:
        self._registry = registry
        self._catalog = catalog if catalog is not None else shipped_catalog()
        self._classes: dict[type, _ClassCodec] = {}
        self._headers: dict[tuple[str, type], bytes] = {}
        self._writers: dict[int, KnownSchema] = {}

    @classmethod
    def from_url(cls, url: str | None, conf: Mapping[str, str | int] | None = None) -> Codec:
        """A codec for registry `url` (``http(s)://...`` or ``mock://...``), or none if None.

        Raises `ConfigError` if the registry client rejects the URL or a setting.
        """
        return cls(None if url is None else SchemaRegistry.from_url(url, conf))

    @property
    def registry(self) -> SchemaRegistry | None:
        return self._registry

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    def _class(self, cls: type) -> _ClassCodec:
        found = self._classes.get(cls)
        if found is None:
            known = self._catalog.schema_for(cls)
            try:
                plan = plan_for(cls)
            except TypeError as exc:
                raise SchemaMismatchError(str(exc)) from exc
            # Schemas are found by class name; a same-named class of another shape (an
            # effect called `Dispatch`, say) must fail here, not write garbage.
            fields = typing.cast(list[dict[str, object]], known.parsed["fields"])
            schema_fields = [str(f["name"]) for f in fields]
            class_fields = [f.name for f in dataclasses.fields(cls)]
            if schema_fields != class_fields:
                raise SchemaMismatchError(
                    f"{cls.__module__}.{cls.__qualname__} fields {class_fields} do not match "
                    f"schema {known.name} fields {schema_fields}"
                )
            try:
                direct: Callable[[object], bytes] | None = record_writer(known.parsed)
            except NotWritable:
                direct = None
            try:
                reader: Callable[[bytes, int], tuple[object, int]] | None = record_reader(known.parsed, cls)
            except Exception:  # NotReadable, or a class it cannot plan: fastavro reads them, as before
                reader = None
            found = _ClassCodec(plan, known, framing.single_object_header(known.fingerprint), direct, reader)
            # A race computes an equal value twice; keeping either is harmless.
            self._classes[cls] = found
        return found

    def _write_body(self, record: object, out: io.BytesIO) -> None:
        codec = self._class(type(record))
        if codec.direct is not None:
            try:
                out.write(codec.direct(record))
                return
            except Exception:  # not written directly: fastavro writes it, or raises its error
                pass
        try:
            fastavro.schemaless_writer(out, codec.schema.parsed, codec.plan.to_avro(record))
        except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
            raise ContractError(f"{type(record).__name__} does not fit its schema: {exc}") from exc

    def canonical_bytes(self, record: object) -> bytes:
        """The schemaless Avro encoding of `record` under its current schema (no framing).

        Raises `ContractError` if `record` has no schema or does not fit it.
        """
        direct = self._class(type(record)).direct
        if direct is not None:
            try:
                return direct(record)
            except Exception:  # not written directly: `_write_body` has fastavro write it
                pass
        out = io.BytesIO()
        self._write_body(record, out)
        return out.getvalue()

    def encode(self, topic: str, record: object) -> bytes:
        """`record` framed for `topic`: Confluent wire format with a registry, else single-object.

        Raises `ContractError` if the record does not fit its schema or the registry
        refuses the schema, and `RetriableError` if the registry cannot be reached.
        """
        codec = self._class(type(record))
        if self._registry is None and codec.direct is not None:
            # The common case, without a BytesIO: most records the processor writes are this.
            try:
                return codec.single_object_header + codec.direct(record)
            except Exception:  # not written directly: `_write_body` has fastavro write it
                pass
        out = io.BytesIO()
        if self._registry is None:
            out.write(codec.single_object_header)
        else:
            key = (topic, type(record))
            header = self._headers.get(key)
            if header is None:
                known = codec.schema
                header = framing.confluent_header(self._registry.register(f"{topic}-value", known.text))
                self._headers[key] = header
            out.write(header)
        self._write_body(record, out)
        return out.getvalue()

    def decode(
        self,
        topic: str | None,
        data: bytes,
        cls: type[T],
        partition: int | None = None,
        offset: int | None = None,
    ) -> T:
        """Decode `data` from `topic` as a record of `cls`, in either framing.

        The writer schema (by fingerprint from the catalog, or by id from the registry)
        is resolved to the current schema of `cls`. Raises `DecodeError` naming `topic`,
        `partition` and `offset` for bad framing, an unknown fingerprint or schema id, a
        Confluent-framed value without a registry, or a body that does not decode
        (truncated, trailing bytes, an unknown union branch, an unresolvable writer
        schema). Raises `RetriableError` if the registry cannot be reached.
        """
        codec = self._class(cls)
        header = codec.single_object_header
        if type(data) is bytes and data.startswith(header):
            # The common case: framed with the current schema of `cls`, so the writer's
            # fingerprint is the reader's (`decode_body`'s fast path, without the frame and
            # catalog lookups). Any failure is judged again below, where it is reported.
            found = _read_straight(codec, data, len(header), cls)
            if found is not None:
                return found
        frame = framing.unframe(data, topic=topic, partition=partition, offset=offset)
        if isinstance(frame, framing.SingleObjectFrame):
            writer = self._catalog.by_fingerprint.get(frame.fingerprint)
            if writer is None:
                raise DecodeError(
                    f"unknown schema fingerprint {frame.fingerprint.hex()} "
                    "(written with a schema this reader does not hold)",
                    topic=topic,
                    partition=partition,
                    offset=offset,
                )
        else:
            writer = self._registry_writer(frame.schema_id, topic, partition, offset)
        return self.decode_body(
            data, frame.body_offset, writer, cls, topic=topic, partition=partition, offset=offset
        )

    def decode_body(
        self,
        data: bytes,
        start: int,
        writer: KnownSchema,
        cls: type[T],
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> T:
        """Read the unframed Avro body at ``data[start:]``, written with `writer`, as `cls`.

        Raises `DecodeError` (naming topic, partition, offset) if the body is truncated,
        has trailing bytes, holds a union branch the reader does not know, or `writer`
        does not resolve to the reader schema of `cls`.
        """
        codec = self._class(cls)
        reader = codec.schema
        if writer.fingerprint == reader.fingerprint:
            # The common case, read straight into the record. Any failure (malformed bytes
            # included) goes the fastavro way below: same value, or the DecodeError it gives.
            found = _read_straight(codec, data, start, cls)
            if found is not None:
                return found
        buf = io.BytesIO(data)
        buf.seek(start)
        try:
            datum = fastavro.schemaless_reader(
                buf,
                writer.parsed,
                # Same schema: skip resolution, the common and fast case.
                None if writer.fingerprint == reader.fingerprint else reader.parsed,
                return_record_name=True,
                return_record_name_override=True,
            )
            if not isinstance(datum, dict):
                raise ValueError(f"expected a record datum, got {type(datum).__name__}")
            value = codec.plan.from_avro(datum)
        except Exception as exc:  # fastavro signals bad bytes with many unrelated types
            raise DecodeError(
                f"{writer.name} body does not decode as {cls.__name__} ({_describe(exc)})",
                topic=topic,
                partition=partition,
                offset=offset,
            ) from exc
        if buf.tell() != len(data):
            raise DecodeError(
                f"{len(data) - buf.tell()} trailing bytes after the {writer.name} body "
                "(wrong writer schema?)",
                topic=topic,
                partition=partition,
                offset=offset,
            )
        if not isinstance(value, cls):
            raise DecodeError(
                f"decoded {type(value).__name__}, expected {cls.__name__}",
                topic=topic,
                partition=partition,
                offset=offset,
            )
        return value

    def _registry_writer(
        self, schema_id: int, topic: str | None, partition: int | None, offset: int | None
    ) -> KnownSchema:
        writer = self._writers.get(schema_id)
        if writer is not None:
            return writer
        if self._registry is None:
            raise DecodeError(
                f"Confluent-framed value (schema id {schema_id}) but no schema registry is configured",
                topic=topic,
                partition=partition,
                offset=offset,
            )
        text = self._registry.schema_text(schema_id)
        if text is None:
            raise DecodeError(
                f"unknown schema id {schema_id} in the registry {self._registry.url}",
                topic=topic,
                partition=partition,
                offset=offset,
            )
        try:
            loaded = json.loads(text)
            if not isinstance(loaded, dict):
                raise ValueError("not a record schema")
            writer = make_known(loaded)
        except (ValueError, ContractError) as exc:
            raise DecodeError(
                f"registry schema id {schema_id} is not a usable Avro record schema: {exc}",
                topic=topic,
                partition=partition,
                offset=offset,
            ) from exc
        # Prefer the catalog's twin (same fingerprint): one parsed copy per schema.
        writer = self._catalog.by_fingerprint.get(writer.fingerprint, writer)
        self._writers[schema_id] = writer
        return writer


_MAX_CAUSE: Final = 240


def _describe(exc: Exception) -> str:
    """A short cause for a DecodeError; fastavro's messages can quote whole schemas."""
    if type(exc).__name__ == "SchemaResolutionError":
        kind = "writer schema does not resolve to the reader schema (a union branch or type the reader lacks)"
    else:
        kind = type(exc).__name__
    text = str(exc)
    if len(text) > _MAX_CAUSE:
        text = text[:_MAX_CAUSE] + "..."
    return f"{kind}: {text}" if text else kind


@functools.cache
def default_codec() -> Codec:
    """The process-wide codec without a registry, over the shipped schemas."""
    return Codec(None)


def straight_reading(cls: type) -> tuple[bytes, Callable[[bytes, int], tuple[object, int]] | None]:
    """The single-object header of `cls`'s current schema, and the reader that reads a body
    of that schema straight into `cls` from ``data[start:]`` (returning the value and where
    it ended), or None where there is none: for a caller that reads many values of one
    class in a row and checks the framing itself, without the calls `decode_value` makes
    per value. Bytes it does not read whole (any exception, bytes left over, another
    class) are for `decode_value`, which reads what it can and reports what is wrong.

    Raises `ContractError` for a class without a schema, as `single_object_header` does.
    """
    codec = default_codec()._class(cls)
    return codec.single_object_header, codec.reader


def canonical_bytes(record: object) -> bytes:
    """The schemaless Avro binary encoding of `record` under its current schema.

    Deterministic: the same record value gives the same bytes in every process and
    language (doubles are their IEEE bits, so ``0.0`` and ``-0.0`` differ although they
    compare equal in Python). The history hash chain and signatures cover these bytes.
    Raises `ContractError` if `record` is not a record class of
    `records.py` or does not fit its schema.
    """
    return default_codec().canonical_bytes(record)


def single_object_header(cls: type) -> bytes:
    """The single-object framing of `cls`'s current schema (``C3 01`` + fingerprint):
    `encode_value(record)` is this header followed by `canonical_bytes(record)`.

    Raises `ContractError` as `canonical_bytes` does for a class without a schema.
    """
    return default_codec()._class(cls).single_object_header


def encode_value(record: object) -> bytes:
    """`record` in Avro single-object encoding: ``C3 01`` + fingerprint + body.

    Raises `ContractError` as `canonical_bytes` does.
    """
    return default_codec().encode("", record)


def decode_value(
    data: bytes,
    cls: type[T],
    *,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
) -> T:
    """Decode a single-object encoded value as a record of `cls` (the no-registry path).

    Raises `DecodeError` naming `topic`, `partition` and `offset` for bad framing, a
    fingerprint this build does not know, a Confluent-framed value (it needs a registry:
    use `Codec`), or a body that does not decode.
    """
    return default_codec().decode(topic, data, cls, partition=partition, offset=offset)


# Built per input or per completion: a faster __init__, same signature (torpor.schemas.frozen).
fast_inits(__name__)
