"""The connector runtime: serves one connector's tools from the Kafka `outbox` (DESIGN 7).

Contract. `ConnectorRuntime(settings, factory, group=..., journal=..., signer=...)`:

- consumes `outbox` read_committed (so no tool runs for a turn that is not durable) in
  its own consumer group, decodes each `Dispatch` for the connector's tools and ignores
  the others (several connectors may share a group name only if they serve the same
  tools: give each connector its own group);
- journals every `invoke` in the `EffectJournal` before the tool sees it (a request id
  already journaled is never run twice; a finished one has its stored answer re-sent),
  keeps approval decisions with the effect they decide, and cancels the journaled effect
  on `cancel` / `close_thread` before the tool stops its work;
- at start, recovers the journal: an effect that was running when the previous process
  died is `unknown`, and the tool's `reconcile(dispatch)` hook decides, before any
  retry, whether it happened (it answers then) or must run again; a finished but
  undelivered answer is re-sent; delivered effects older than `retention_ms` are pruned (then
  hourly);
- produces the connector's inputs (`ToolResult`, `ToolEvent`, `TimerFired`,
  `ApprovalRequest`) to `inputs` with an idempotent producer, at the partition murmur2
  picks for the thread, signed with `signer` when there is one; a call's final answer
  is journaled before it is produced and marked delivered when the broker acknowledges
  (one the producer gave up on because the broker was away is produced again, the same
  bytes, until it is delivered);
- with `max_concurrency`, takes no new dispatch while that many calls run (the outbox
  partitions are paused, the group membership kept): for tools that cost a process or
  a connection each. Waits (timers) count as running: leave it unset for them;
- commits outbox offsets as soon as the dispatches are journaled: the journal, not the
  offset, holds an effect from then on, so a week-long timer holds back nothing. Commits
  are asynchronous (`connectors.offsets`): a group without a coordinator (a broker
  restart) delays them, never the loop, which keeps serving dispatches meanwhile;
- when nothing is waiting, waits for the outbox on a thread of its own (`_wait`): a
  dispatch is taken as soon as it comes, and the tools' tasks run meanwhile;
- replaces its consumer when it has been out of its group for two session timeouts
  straight (`streams.membership`: librdkafka's consumer can stay out for good after a
  broker restart, and the connector would take no dispatch until restarted). The
  dispatches the old one took but had not committed come again to the new one: the
  journal runs none twice.

Message ids of answers derive from the request id (`InProcessConnector.produce`), so any
answer produced twice (a re-run after a crash, a re-sent stored answer) is one input to
the fold. A tool that raises answers with an error result: in its task
(`InProcessConnector.start`), or when it is handed a dispatch (`connectors.intake`).

The journal discipline itself (route, send, recover) is `connectors.intake`, shared with
the Faust adapter; this module is its confluent-kafka transport.
`TORPOR_CONNECTOR_FAULT=after_effect` is honoured there (`intake.FAULT_ENV`).

With a `Tracing` (`--traces`), each dispatch taken is an effect span under its outbox
record's trace context, and the connector's inputs for it carry that span's context
(`connectors.tracing`).

An undecodable dispatch is logged loudly and skipped: a connector cannot act on it,
and the processor's receipts already account for the turn that made it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Final, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from torpor.connectors.inprocess import CLOSE_THREAD
from torpor.connectors.intake import DEFAULT_RETENTION_MS, JournaledIntake
from torpor.connectors.journal import EffectJournal
from torpor.connectors.manifest import publish_manifest
from torpor.connectors.metrics import ConnectorObserver
from torpor.connectors.offsets import OutboxOffsets
from torpor.schemas.codec import Codec
from torpor.schemas.errors import ConfigError, DecodeError
from torpor.schemas.records import Dispatch, Input, ToolSpec
from torpor.schemas.signer import Signer
from torpor.streams.clients import (
    OnDelivery,
    SentRecord,
    make_consumer,
    make_producer,
    produce_again,
    sent_record,
)
from torpor.streams.config import Settings, consumer_config
from torpor.streams.errors import is_transient_delivery_error, translate
from torpor.streams.membership import GroupWatch, stuck_after_for
from torpor.streams.partitioner import partition_for
from torpor.streams.topics import TopicNames
from torpor.streams.topicwait import PAUSE_S as TOPIC_PAUSE_S
from torpor.streams.topicwait import TopicWait

if TYPE_CHECKING:  # the optional extra `otel`: imported at run time only with tracing on
    from torpor.connectors.tracing import EffectTraces
    from torpor.streams.tracing import Tracing

log = logging.getLogger(__name__)

# How long one wait for the outbox may last (on the waiter thread: the tools' tasks run
# meanwhile, and a dispatch is taken as soon as it comes); bounds the stop latency.
POLL_SECONDS: Final = 0.05
# Dispatches taken per poll at most.
TAKE: Final = 100
# Deliver answers before stopping; and wait at most as long for the last outbox commit.
FLUSH_SECONDS: Final = 10.0


class Connector(Protocol):
    """What the runtime drives: `InProcessConnector` and `ToolRouter` both fit."""

    @property
    def specs(self) -> tuple[ToolSpec, ...]: ...

    @property
    def busy(self) -> int: ...

    def submit(self, dispatch: Dispatch) -> None: ...

    def reconcile(self, dispatch: Dispatch) -> bool: ...

    def failed(self, dispatch: Dispatch, error: BaseException) -> None: ...

    async def close(self) -> None: ...


ConnectorFactory = Callable[[Callable[[Input], None], Callable[[], int]], Connector]
"""Builds a connector from its input sink and its clock (`EchoTool` is one)."""


def now_ms() -> int:
    """Wall-clock milliseconds: stamps the answers (a connector's inputs carry their time)."""
    return time.time_ns() // 1_000_000


class ConnectorRuntime:
    """Serves one connector from the outbox (see the module docstring)."""

    def __init__(self, settings: Settings, factory: ConnectorFactory, *, group: str,
                 journal: EffectJournal | None = None, codec: Codec | None = None,
                 signer: Signer | None = None, retention_ms: int = DEFAULT_RETENTION_MS,
                 max_concurrency: int | None = None, clock: Callable[[], int] = now_ms,
                 wait_for_topics: bool = True, observer: ConnectorObserver | None = None,
                 tracing: Tracing | None = None, group_watch: GroupWatch | None = None) -> None:
        if max_concurrency is not None and max_concurrency < 1:
            raise ConfigError(f"--concurrency must be at least 1, not {max_concurrency}")
        self._max_concurrency = max_concurrency
        self._paused = False
        self._topics = TopicNames.for_prefix(settings.topics.prefix)
        self._codec = codec or Codec.from_url(settings.schema_registry.url)
        self._intake = JournaledIntake(
            journal or EffectJournal(), codec=self._codec, inputs_topic=self._topics.inputs,
            max_bytes=settings.inputs.max_bytes, signer=signer, clock=clock, produce=self._produce,
            retention_ms=retention_ms)
        self.journal = self._intake.journal
        self._observer = observer  # told what is taken, produced and journaled (connectors.metrics)
        self._traces: EffectTraces | None = None
        if tracing is not None:
            # Imported only when on: the OpenTelemetry SDK is an optional extra (`otel`).
            from torpor.connectors.tracing import EffectTraces

            self._traces = EffectTraces(tracing)
        if observer is not None:
            self.journal.on_moved = observer.effect_moved
        self._settings = settings
        self._group = group
        self._consumer, self._offsets = self._new_consumer()
        self._group_watch = group_watch or GroupWatch(stuck_after_for(consumer_config(settings, group)))
        self.consumers_replaced = 0
        self._waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-wait")  # `_wait`
        self._producer = make_producer(settings)
        # The topics it reads and writes; a processor (or `torpor topics create`) makes them.
        self._topic_wait = TopicWait(
            self._producer, (self._topics.outbox, self._topics.inputs, self._topics.toolsets),
            settings.kafka.bootstrap_servers, wait=wait_for_topics)
        self._partitions = 0  # of `inputs`, known once the topics are found
        if not wait_for_topics:
            self._found_topics(self._topic_wait.check())  # MissingTopicsError: one line, exit 1
        self.connector = factory(self._intake.send, clock)
        self._tools = frozenset(spec.name for spec in self.connector.specs)
        # Since when nothing ran, nothing was unread and everything was committed (None:
        # busy). Written by the loop only; a processor hosting this runtime reads it.
        self.idle_since: float | None = None
        self.handled = 0
        # Answers whose delivery failed, to produce again: appended by the delivery report,
        # produced by the loop, never from inside the report (`clients.produce_again`).
        self._again: deque[tuple[SentRecord, OnDelivery]] = deque()

    # --- producing ---------------------------------------------------------------------

    def _produce(self, record: Input, request_id: str | None, value: bytes) -> None:
        key = record.thread_id.encode("utf-8")
        on_delivery = None if request_id is None else self._delivered_callback(request_id)
        headers: list[tuple[str, str | bytes | None]] | None = None
        if self._traces is not None:
            headers = list(self._traces.headers_for(record, request_id)) or None
        while True:
            try:
                self._producer.produce(self._topics.inputs, value=value, key=key,
                                       partition=partition_for(key, self._partitions),
                                       on_delivery=on_delivery, headers=headers)
                if self._observer is not None:
                    self._observer.sent(record)
                return
            except BufferError:
                self._producer.poll(0.05)

    def _delivered_callback(self, request_id: str) -> OnDelivery:
        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is None:
                self._intake.delivered(request_id)
                return
            again = sent_record(message)
            if is_transient_delivery_error(error) and again is not None:
                # The broker was away longer than the delivery timeout: the same answer again
                # (a copy that did arrive is a duplicate the fold absorbs), not only at the
                # next start, while the thread waits for it.
                log.warning("answer not delivered: %s; sending it again", error,
                            extra={"message_id": request_id})
                self._again.append((again, delivered))
            else:  # stays `done`: re-sent at the next start
                log.warning("answer not delivered: %s", error, extra={"message_id": request_id})
        return delivered

    # --- the loop ----------------------------------------------------------------------

    async def run(self, should_stop: Callable[[], bool]) -> None:
        """Wait for the topics, recover, then serve dispatches until `should_stop()`; then stop
        the tools and commit."""
        try:
            while not self._partitions:
                found = self._topic_wait.check()
                if found is not None:
                    self._found_topics(found)
                elif should_stop():
                    return
                else:
                    await asyncio.sleep(TOPIC_PAUSE_S)
            publish_manifest(self._producer, self._topics.toolsets, self.connector.specs, source=self._source)
            self._intake.recover(self.connector)
            self._consumer.subscribe([self._topics.outbox])
            came: list[Message] = []  # what the last wait brought
            while not should_stop():
                room = self._room()
                messages = came or self._consumer.consume(room, timeout=0)
                taken: list[Dispatch] = []
                for message in messages:
                    dispatch = self._take(message.error(), message.value(), message.partition(),
                                          message.offset())
                    if dispatch is not None:
                        taken.append(dispatch)
                        if self._observer is not None:  # before routing: the journal's moves come after
                            self._observer.taken(dispatch)
                        if self._traces is not None:  # before routing: a stored answer is re-sent there
                            carried = message.headers()
                            self._traces.taken(dispatch, carried if isinstance(carried, list) else None)
                if taken:
                    # One synced journal write for the batch, then the tools start (group commit).
                    self._intake.route_all(taken, self.connector)
                    self.handled += len(taken)
                    for dispatch in taken:
                        log.info("dispatch %s %s journaled", dispatch.kind, dispatch.tool, extra={
                            "thread_id": dispatch.thread_id, "message_id": dispatch.request_id,
                            "request_id": dispatch.request_id})
                # Only now: a journal write that raised must not let the offsets pass its dispatches.
                for message in messages:
                    partition, offset = message.partition(), message.offset()
                    if message.error() is None and partition is not None and offset is not None:
                        self._offsets.taken(partition, offset)
                self._producer.poll(0)
                produce_again(self._producer, self._again)
                if self._observer is not None:
                    self._observer.running(self.connector.busy)
                self._offsets.commit_due()
                self._intake.prune_due()
                if self._group_watch.stuck(self._consumer.memberid(), time.monotonic()):
                    self._replace_consumer()
                    messages = []  # so the next batch is waited for from the new consumer
                idle = not messages and self.connector.busy == 0 and not self._again and self._caught_up()
                if idle and self.idle_since is None:
                    self.idle_since = time.monotonic()
                elif not idle:
                    self.idle_since = None
                if messages:
                    came = []
                    await asyncio.sleep(0)  # the tools' tasks run here
                else:
                    came = await self._wait(room)  # and here
        finally:
            self._waiter.shutdown(wait=True)  # a wait cut short by a cancel: the consumer is ours again
            # Running effects stay `dispatched` in the journal: the next start reconciles them.
            await self.connector.close()
            produce_again(self._producer, self._again)
            if self._producer.flush(FLUSH_SECONDS) > 0 or self._again:
                log.warning("some answers were not delivered before the stop: re-sent at the next start")
            self._offsets.commit_now(FLUSH_SECONDS)
            self._consumer.close()
            self.journal.close()
            if self._traces is not None:
                self._traces.close()

    async def _wait(self, room: int) -> list[Message]:
        """Nothing was waiting: wait for the outbox, `POLL_SECONDS` at most, on the waiter
        thread (the loop runs the tools' tasks meanwhile). librdkafka serves the consumer's
        callbacks (`on_commit`) there, while this loop awaits it: one user at a time."""
        return await asyncio.wrap_future(self._waiter.submit(self._wait_for_one, room))

    def _wait_for_one(self, room: int) -> list[Message]:
        # consume(n, timeout) returns only once it has n records or the timeout passed: wait
        # for one, then take what came with it.
        first = self._consumer.consume(1, timeout=POLL_SECONDS)
        return first + self._consumer.consume(room - 1, timeout=0) if first and room > 1 else first

    def _new_consumer(self) -> tuple[Consumer, OutboxOffsets]:
        """A consumer of the connector's group and the offsets it takes. Its commit answers go
        to its own `OutboxOffsets`, so a replaced consumer closing on another thread never
        touches the tracker of the one that replaced it."""
        holder: list[OutboxOffsets] = []

        def on_commit(error: KafkaError | None, partitions: list[TopicPartition]) -> None:
            if holder:  # bound before the tracker exists (the consumer needs its callback first)
                holder[0].on_commit(error, partitions)

        consumer = make_consumer(self._settings, self._group, on_commit=on_commit)
        holder.append(OutboxOffsets(consumer, self._topics.outbox))
        return consumer, holder[0]

    def _replace_consumer(self) -> None:
        """The consumer has been out of its group too long (`GroupWatch`): a new one joins.

        Called from the loop between waits, so the waiter thread does not hold the old one.
        The old one is closed on a thread of its own: its close may wait on the coordinator
        it cannot find, and the tools must not wait with it."""
        stuck = self._consumer
        log.warning(
            "the outbox consumer has had no group membership for %.0f s: replacing it (dispatches "
            "it took but had not committed come again; the journal runs none twice)",
            self._group_watch.stuck_after_s, extra={"group": self._group})
        self._consumer, self._offsets = self._new_consumer()
        self._paused = False
        self._consumer.subscribe([self._topics.outbox])
        self.consumers_replaced += 1
        threading.Thread(target=_close_quietly, args=(stuck,), name="outbox-consumer-close",
                         daemon=True).start()

    def _found_topics(self, found: Mapping[str, int] | None) -> None:
        if found is not None:
            self._partitions = found[self._topics.inputs]

    def _caught_up(self) -> bool:
        """Every assigned outbox partition read to its end (cached watermarks: no request)."""
        assignment = self._consumer.assignment()
        if not assignment:
            return False
        for position in self._consumer.position(assignment):
            try:
                _, high = self._consumer.get_watermark_offsets(position, cached=True)
            except KafkaException:
                return False
            if high > 0 and (position.offset < 0 or position.offset < high):
                return False
        return self._offsets.settled

    def _room(self) -> int:
        """How many dispatches to take now: all that come, or what `max_concurrency` leaves."""
        if self._max_concurrency is None:
            return TAKE
        room = self._max_concurrency - self.connector.busy
        assignment = self._consumer.assignment()
        if room <= 0:
            # Paused, not unpolled: consume() keeps the group membership and rebalances alive.
            if assignment:
                self._consumer.pause(assignment)
            self._paused = True
            return 1
        if self._paused and assignment:
            self._consumer.resume(assignment)
            self._paused = False
        return min(room, TAKE)

    @property
    def _source(self) -> str:
        return str(getattr(self.connector, "source", "connector"))

    def _take(self, error: KafkaError | None, value: bytes | None, partition: int | None,
              offset: int | None) -> Dispatch | None:
        """The dispatch a consumed message holds, if it is this connector's."""
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return None
            raise translate(error, operation="consume outbox")
        assert partition is not None and offset is not None
        try:
            dispatch = self._codec.decode(self._topics.outbox, value or b"", Dispatch,
                                          partition=partition, offset=offset)
        except DecodeError as exc:
            log.error("undecodable dispatch skipped: %s", exc,
                      extra={"partition": partition, "offset": offset})
            return None
        if dispatch.tool not in self._tools and dispatch.kind != CLOSE_THREAD:
            return None  # another connector's
        return dispatch


def _close_quietly(consumer: Consumer) -> None:
    """Close a replaced consumer; whatever it raises, it is gone for this runtime."""
    try:
        consumer.close()
    except Exception as error:  # a stuck client: nothing to do but say so
        log.warning("closing the replaced outbox consumer failed: %s", error)
