"""Torpor's topics as Faust topics, with their Avro codecs registered.

Contract. `TorporTopics.of(app)` gives the Faust topics of the Torpor deployment that
`app` (a `torpor.faust.App`) was made for: `outbox` (`Dispatch` values), `events`
(`ThreadEvent`), `receipts` (`Receipt`) and `inputs` (`Input`), each keyed by thread id
(a `str`), each decoded and encoded by `AvroCodec` (and the codecs registered under
`codec.CODEC_NAMES`). Agents iterate them as usual::

    topics = TorporTopics.of(app)

    @app.agent(topics.receipts)
    async def audit(receipts: faust.StreamT[Receipt]) -> None:
        async for receipt in receipts:
            ...

Raises `ConfigError` for an app that is not a `torpor.faust.App`: a plain `faust.App`
outside Faust's transactional mode reads records of aborted transactions
(`torpor.faust.app`). None of these topics is declared: Faust never creates them.
"""

from __future__ import annotations

from dataclasses import dataclass

import faust
from faust.types import TopicT

from torpor.faust.app import App, ReadCommittedTransport
from torpor.faust.codec import register_codecs
from torpor.schemas.codec import Codec
from torpor.schemas.errors import ConfigError
from torpor.streams.topics import TopicNames


@dataclass(frozen=True, slots=True)
class TorporTopics:
    """The Faust topics of one Torpor deployment (module docstring)."""

    names: TopicNames
    codec: Codec
    outbox: TopicT
    events: TopicT
    receipts: TopicT
    inputs: TopicT

    @classmethod
    def of(cls, app: faust.App, codec: Codec | None = None) -> TorporTopics:
        """The topics for `app`'s settings (module docstring); `ConfigError` for a plain app."""
        if not isinstance(app, App) or not isinstance(app.transport, ReadCommittedTransport):
            raise ConfigError(
                f"Faust app {app.conf.id!r} is a {type(app).__name__}: read Torpor's topics with "
                "torpor.faust.App, whose consumer reads only committed records")
        settings = app.torpor_settings
        codec = codec or Codec.from_url(settings.schema_registry.url)
        codecs = register_codecs(settings, codec)

        def topic(role: str) -> TopicT:
            avro = codecs[role]
            return app.topic(avro.topic, key_type=str, key_serializer="raw", value_serializer=avro)

        return cls(TopicNames.for_prefix(settings.topics.prefix), codec, topic("outbox"), topic("events"),
                   topic("receipts"), topic("inputs"))
