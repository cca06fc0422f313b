"""A minimal outbox runner: in-process connectors served from the Kafka `outbox`.

This is not the connector runtime of DESIGN section 7 (no effect journal, no
reconciliation of unknown effects: a later issue). It is the smallest honest bridge
that lets the Kafka processor's dispatches reach the local tools (`echo`, ...):

- a read_committed consumer of `outbox` (so no tool runs for a turn that is not
  durable), in consumer group `group`, decodes each `Dispatch` and hands it to the
  connector's `submit` on an asyncio loop; the connector does the work in tasks;
- the connector's answers (`ToolResult` inputs, message ids derived from the request
  id by `InProcessConnector`) go to `inputs` through an idempotent producer, to the
  partition murmur2 picks for the thread id;
- offsets are committed only when no work is in flight and every answer is delivered:
  a crash re-delivers dispatches (at least once), and the fold absorbs the repeated
  answers by message id.

- with a `Signer`, every answer is signed before it is produced (a processor with a key
  ring judges unsigned connector input `rejected:unsigned`, `missing_signature`).

An undecodable dispatch is logged loudly and skipped: a connector cannot act on it,
and the processor's receipts already account for the turn that made it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from torpor.connectors.signer import Signer
from torpor.schemas.codec import Codec
from torpor.schemas.errors import DecodeError
from torpor.schemas.records import Dispatch, Input
from torpor.streams.clients import make_consumer, make_producer
from torpor.streams.config import Settings
from torpor.streams.errors import translate
from torpor.streams.partitioner import partition_for
from torpor.streams.topics import TopicNames

log = logging.getLogger(__name__)

# How long one poll of the outbox may wait; bounds the stop latency and lets the tasks run.
POLL_SECONDS: Final = 0.05
# Deliver answers before committing the dispatches they answer.
FLUSH_SECONDS: Final = 10.0


class Connector(Protocol):
    """What the runner drives: `InProcessConnector` and `ToolRouter` both fit."""

    @property
    def busy(self) -> int: ...

    def submit(self, dispatch: Dispatch) -> None: ...

    async def close(self) -> None: ...


ConnectorFactory = Callable[[Callable[[Input], None], Callable[[], int]], Connector]
"""Builds a connector from its input sink and its clock (`EchoTool` is one)."""


def now_ms() -> int:
    """Wall-clock milliseconds: stamps the answers (a connector's inputs carry their time)."""
    return time.time_ns() // 1_000_000


class OutboxRunner:
    """Serves one connector from the outbox (see the module docstring)."""

    def __init__(self, settings: Settings, factory: ConnectorFactory, *, group: str,
                 codec: Codec | None = None, signer: Signer | None = None) -> None:
        self._signer = signer
        self._topics = TopicNames.for_prefix(settings.topics.prefix)
        self._codec = codec or Codec.from_url(settings.schema_registry.url)
        self._consumer = make_consumer(settings, group)
        self._producer = make_producer(settings)
        metadata = self._producer.list_topics(self._topics.inputs, timeout=10.0).topics[self._topics.inputs]
        if metadata.error is not None:
            raise translate(metadata.error, operation=f"metadata of {self._topics.inputs}")
        self._partitions = len(metadata.partitions)
        self.connector = factory(self._send, now_ms)
        self._uncommitted: dict[int, int] = {}
        self.handled = 0

    def _send(self, record: Input) -> None:
        if self._signer is not None:
            record = self._signer.sign(record)
        key = record.thread_id.encode("utf-8")
        value = self._codec.encode(self._topics.inputs, record)
        while True:
            try:
                self._producer.produce(self._topics.inputs, value=value, key=key,
                                       partition=partition_for(key, self._partitions))
                return
            except BufferError:
                self._producer.poll(0.05)

    async def run(self, should_stop: Callable[[], bool]) -> None:
        """Serve dispatches until `should_stop()`; then finish what runs and commit."""
        self._consumer.subscribe([self._topics.outbox])
        try:
            while not should_stop():
                messages = self._consumer.consume(100, timeout=0)
                for message in messages:
                    self._take(message.error(), message.value(), message.partition(), message.offset())
                self._producer.poll(0)
                if self._uncommitted and self.connector.busy == 0:
                    self._commit()
                await asyncio.sleep(0 if messages else POLL_SECONDS)  # the tools' tasks run here
        finally:
            await self.connector.close()
            self._commit()
            self._consumer.close()

    def _take(self, error: KafkaError | None, value: bytes | None, partition: int | None,
              offset: int | None) -> None:
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return
            raise translate(error, operation="consume outbox")
        assert partition is not None and offset is not None
        self._uncommitted[partition] = offset + 1
        try:
            dispatch = self._codec.decode(self._topics.outbox, value or b"", Dispatch,
                                          partition=partition, offset=offset)
        except DecodeError as exc:
            log.error("undecodable dispatch skipped: %s", exc,
                      extra={"partition": partition, "offset": offset})
            return
        log.info("dispatch %s %s", dispatch.kind, dispatch.tool, extra={
            "thread_id": dispatch.thread_id, "message_id": dispatch.request_id,
            "partition": partition, "offset": offset})
        self.connector.submit(dispatch)
        self.handled += 1

    def _commit(self) -> None:
        """Commit what was handled, once every answer it caused is delivered."""
        if not self._uncommitted:
            return
        if self._producer.flush(FLUSH_SECONDS) > 0:
            log.warning("answers still undelivered: dispatches stay uncommitted (they will be redone)")
            return
        offsets = [TopicPartition(self._topics.outbox, p, o) for p, o in self._uncommitted.items()]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("outbox commit failed, dispatches will be redone: %s",
                        translate(exc, operation="commit"))
            return
        self._uncommitted.clear()
