"""Torpor's Avro codec as a Faust codec.

Contract. `AvroCodec(record_type, topic, codec)` is a `faust.Codec` that decodes a
record value of `topic` into the frozen dataclass `record_type` of `torpor.schemas.records`
(`Dispatch`, `ThreadEvent`, `Receipt`, `Input`) and encodes one back, with
`torpor.schemas.codec.Codec`: either framing is read (single-object encoding, or the
Confluent wire format when the codec has a schema registry), and values are written as
every other Torpor producer writes them. A value that does not decode raises
`DecodeError`, which Faust reports as a `ValueDecodeError` and skips.

`register_codecs(settings)` registers one codec a topic under Faust's codec names
`CODEC_NAMES` (``torpor_outbox``, ``torpor_events``, ...), so a Faust app may name them
(``app.topic(..., value_serializer="torpor_receipts")``). Faust's registry is global:
the last registration wins, so a process serves one Torpor topic prefix.
"""

from __future__ import annotations

from typing import Any, Final

from faust.serializers import codecs as faust_codecs
from faust.types.codecs import CodecT

from torpor.schemas.codec import Codec
from torpor.schemas.records import Dispatch, Input, Receipt, ThreadEvent
from torpor.streams.config import Settings
from torpor.streams.topics import Topic, TopicNames

RECORD_TYPES: Final[dict[str, type]] = {
    "inputs": Input,
    "outbox": Dispatch,
    "events": ThreadEvent,
    "receipts": Receipt,
}
"""The record type of each Torpor topic a Faust app may read or write (DESIGN 3)."""

CODEC_NAMES: Final[dict[str, str]] = {role: f"torpor_{role}" for role in RECORD_TYPES}


class AvroCodec(faust_codecs.Codec):
    """Torpor's Avro records of one topic (module docstring)."""

    def __init__(self, record_type: type, topic: str, codec: Codec,
                 children: tuple[CodecT, ...] | None = None, **kwargs: Any) -> None:
        # Faust clones a codec with `type(self)(children=..., **self.kwargs)`: keep ours there.
        super().__init__(children, record_type=record_type, topic=topic, codec=codec, **kwargs)
        self.record_type = record_type
        self.topic = topic
        self.codec = codec

    def _loads(self, s: bytes) -> Any:
        return self.codec.decode(self.topic, s, self.record_type)

    def _dumps(self, s: Any) -> bytes:
        if not isinstance(s, self.record_type):
            raise TypeError(f"{self.topic} carries {self.record_type.__name__} records, "
                            f"not {type(s).__name__}")
        return self.codec.encode(self.topic, s)


def codecs_for(settings: Settings, codec: Codec | None = None) -> dict[str, AvroCodec]:
    """One `AvroCodec` per topic role of `RECORD_TYPES`, for `settings`' topic prefix."""
    codec = codec or Codec.from_url(settings.schema_registry.url)
    names = TopicNames.for_prefix(settings.topics.prefix)
    return {role: AvroCodec(record_type, names.of(Topic(role)), codec)
            for role, record_type in RECORD_TYPES.items()}


def register_codecs(settings: Settings, codec: Codec | None = None) -> dict[str, AvroCodec]:
    """Register `codecs_for(settings)` under `CODEC_NAMES`; return them by topic role."""
    found = codecs_for(settings, codec)
    for role, avro in found.items():
        faust_codecs.register(CODEC_NAMES[role], avro)
    return found
