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

A record whose key or value does not decode is logged (topic, partition, offset, why)
and skipped, as `ConnectorRuntime` skips an undecodable dispatch: Faust would otherwise
throw the error into the agent, which crashes and is restarted (and more than 100 such
records in a second exceed the agent supervisor's restart budget: the worker exits). Faust acks the record
before it reports the error, so the skip is committed like any processed record.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import faust
from faust.types import Message, TopicT

from torpor.faust.app import App, ReadCommittedTransport
from torpor.faust.codec import register_codecs
from torpor.schemas.codec import Codec
from torpor.schemas.errors import ConfigError
from torpor.streams.topics import TopicNames

log = logging.getLogger(__name__)


class TorporTopic(faust.Topic):
    """A Faust topic that skips, loudly, what does not decode (module docstring)."""

    async def on_key_decode_error(self, exc: Exception, message: Message) -> None:
        self._skip(exc, message)

    async def on_value_decode_error(self, exc: Exception, message: Message) -> None:
        self._skip(exc, message)

    def _skip(self, exc: Exception, message: Message) -> None:
        # The codec cannot know where the bytes came from: the message does.
        log.error("undecodable record skipped at %s[%s]@%s: %s", message.topic, message.partition,
                  message.offset, exc, extra={"partition": message.partition, "offset": message.offset})


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
            return TorporTopic(app, topics=[avro.topic], key_type=str, key_serializer="raw",
                               value_serializer=avro)

        return cls(TopicNames.for_prefix(settings.topics.prefix), codec, topic("outbox"), topic("events"),
                   topic("receipts"), topic("inputs"))
