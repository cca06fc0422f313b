"""Toolset manifests on the compacted `toolsets` topic: what tools exist, for clients.

Contract. A connector publishes, at start, one record per toolset it serves: key the
toolset name (`ToolSpec.toolset`), value JSON (a manifest any language reads without
Avro)::

    {"toolset": "local", "version": "<sha256 of the tools, 16 hex>", "source": "connector:echo",
     "tools": [{"name": "echo", "description": "...", "parameters": {...JSON Schema...},
                "result_schema": null | {...}, "passive": false}, ...]}

`version` changes exactly when a tool definition does, so a client can tell a thread
created against an older toolset. The topic is compacted: the latest manifest per
toolset is what `read_toolsets` returns. A `CreateThread` carries the full `ToolSpec`s
it grants (`Manifest.specs`, their schemas in canonical JSON text: `canonical_spec`):
the fold never looks tools up.

Every spec is checked with `torpor.schemas.jsontext.tool_spec_problem`, the same check
the fold makes at `CreateThread`: `publish_manifest` refuses an invalid spec with a
`ConfigError` (the connector does not start with a tool no thread could be created
with), and `decode_manifest` leaves an invalid spec out of what it returns, naming it in
`Manifest.skipped`, so a reader of `toolsets` never crashes on what another connector
wrote; `read_toolsets` logs a warning for each skipped spec or undecodable record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from torpor.schemas.errors import ConfigError, DecodeError, RetriableError
from torpor.schemas.jsontext import MAX_SCHEMA_DEPTH, parse_json, tool_spec_problem
from torpor.schemas.records import ToolSpec
from torpor.streams.clients import make_consumer
from torpor.streams.config import Settings
from torpor.streams.deadline import Deadline
from torpor.streams.errors import translate
from torpor.streams.topics import TopicNames

log = logging.getLogger(__name__)

READ_SECONDS: Final = 10.0
_MANIFEST_DEPTH: Final = MAX_SCHEMA_DEPTH + 3  # the document, its tool list and a tool around each schema
# librdkafka does not flag these retriable, but right after a topic is created they are.
_NO_LEADER_YET: Final = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                                   KafkaError.UNKNOWN_TOPIC_OR_PART})


@dataclass(frozen=True, slots=True)
class Manifest:
    """One toolset as published: its name, version, the connector's source, its tools."""

    toolset: str
    version: str
    source: str
    specs: tuple[ToolSpec, ...]
    skipped: tuple[str, ...] = ()  # "<tool>: <problem>" for each invalid spec left out


def manifests(specs: Iterable[ToolSpec], source: str) -> list[Manifest]:
    """One manifest per toolset among `specs`."""
    by_toolset: dict[str, list[ToolSpec]] = {}
    for spec in specs:
        by_toolset.setdefault(spec.toolset or "default", []).append(spec)
    return [Manifest(name, _version(found), source, tuple(found))
            for name, found in sorted(by_toolset.items())]


def encode_manifest(manifest: Manifest) -> bytes:
    return json.dumps(_document(manifest), sort_keys=True).encode("utf-8")


def decode_manifest(value: bytes, *, where: str = "toolsets") -> Manifest:
    """Parse a manifest; `DecodeError` naming `where` for anything that is not one.

    A spec that `tool_spec_problem` refuses is left out and named in `skipped`."""
    try:
        data = parse_json(value.decode("utf-8"), max_depth=_MANIFEST_DEPTH)
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        specs = tuple(
            ToolSpec(name=str(t["name"]), description=str(t["description"]),
                     parameters=canonical_json(t["parameters"]),
                     result_schema=None if t.get("result_schema") is None
                     else canonical_json(t["result_schema"]),
                     passive=bool(t["passive"]), toolset=str(data["toolset"]))
            for t in data["tools"]
        )
        problems = [(spec, tool_spec_problem(spec)) for spec in specs]
        return Manifest(str(data["toolset"]), str(data["version"]), str(data["source"]),
                        tuple(spec for spec, problem in problems if problem is None),
                        tuple(f"{spec.name}: {problem}" for spec, problem in problems if problem is not None))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise DecodeError(f"not a toolset manifest: {error}", topic=where) from None


def canonical_json(value: object) -> str:
    """The JSON text a manifest's schemas decode to: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def canonical_spec(spec: ToolSpec) -> ToolSpec:
    """`spec` with its schemas in canonical JSON text, as `decode_manifest` returns it."""
    return dataclasses.replace(
        spec, parameters=canonical_json(json.loads(spec.parameters)),
        result_schema=None if spec.result_schema is None else canonical_json(json.loads(spec.result_schema)))


def publish_manifest(producer: Producer, topic: str, specs: Iterable[ToolSpec], *, source: str) -> None:
    """Produce the manifests of `specs` to `topic` (the producer's next flush delivers them).

    `ConfigError` if a spec is invalid (`tool_spec_problem`): nothing is produced."""
    specs = tuple(specs)
    for spec in specs:
        problem = tool_spec_problem(spec)
        if problem is not None:
            raise ConfigError(f"{source} cannot publish tool {spec.name!r}: {problem}; fix its schema")
    for manifest in manifests(specs, source):
        producer.produce(topic, key=manifest.toolset.encode("utf-8"), value=encode_manifest(manifest))


def read_toolsets(settings: Settings, timeout_s: float = READ_SECONDS) -> dict[str, Manifest]:
    """The latest manifest of every toolset on the `toolsets` topic (read to its end)."""
    topic = TopicNames.for_prefix(settings.topics.prefix).toolsets
    consumer = make_consumer(settings, f"torpor-toolsets-{uuid.uuid4().hex}")
    deadline = Deadline.after(timeout_s)
    found: dict[str, Manifest] = {}
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if metadata.error is not None:
            raise translate(metadata.error, operation=f"metadata of {topic}")
        partitions = [TopicPartition(topic, p, 0) for p in metadata.partitions]
        ends = {p.partition: _end(consumer, p, deadline) for p in partitions}
        consumer.assign(partitions)
        pending = {p for p, end in ends.items() if end > 0}
        while pending and not deadline.expired():
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise translate(error, operation=f"read {topic}")
            key, value = message.key(), message.value()
            if key is not None and value is not None:
                _take(found, key.decode("utf-8", "replace"), value, topic)
            elif key is not None:
                found.pop(key.decode("utf-8"), None)  # a tombstone: the toolset was withdrawn
            if (message.offset() or 0) + 1 >= ends[message.partition() or 0]:
                pending.discard(message.partition() or 0)
    finally:
        consumer.close()
    return found


def _take(found: dict[str, Manifest], toolset: str, value: bytes, topic: str) -> None:
    """Keep the manifest in `value` (without its invalid specs); warn about what is skipped."""
    try:
        manifest = decode_manifest(value, where=topic)
    except DecodeError as error:
        log.warning("toolset %r skipped: %s", toolset, error)
        return
    for skipped in manifest.skipped:
        log.warning("toolset %r: tool skipped, %s", toolset, skipped)
    found[toolset] = manifest


def _end(consumer: Consumer, partition: TopicPartition, deadline: Deadline) -> int:
    while True:  # a topic just created may have no leader yet: retriable, until the deadline
        try:
            return int(consumer.get_watermark_offsets(partition, timeout=deadline.timeout_for_call(5.0))[1])
        except KafkaException as exc:
            error = translate(exc, operation=f"the end of {partition.topic}[{partition.partition}]")
            electing = exc.args[0].code() in _NO_LEADER_YET
            if not (electing or isinstance(error, RetriableError)) or deadline.expired():
                raise error from exc
            time.sleep(0.1)  # the election takes a moment; do not spin on the broker


def _document(manifest: Manifest) -> dict[str, Any]:
    return {
        "toolset": manifest.toolset,
        "version": manifest.version,
        "source": manifest.source,
        "tools": [_tool(spec) for spec in manifest.specs],
    }


def _tool(spec: ToolSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "description": spec.description,
        "parameters": json.loads(spec.parameters),
        "result_schema": None if spec.result_schema is None else json.loads(spec.result_schema),
        "passive": spec.passive,
    }


def _version(specs: list[ToolSpec]) -> str:
    canonical = json.dumps([_tool(s) for s in specs], sort_keys=True).encode("utf-8")
    return hashlib.sha256(canonical).hexdigest()[:16]
