"""The Kafka processor: `step` and the model stage, run by the exactly-once checkpoint loop.

Contract. `Processor(settings, config, provider).run(should_stop, until_idle)` runs one
processor instance: one consumer and one transactional producer (`<app>-<instance>`)
in `streams.loop.CheckpointLoop`, which gives each owned `inputs` partition a
`ThreadTask`. Per checkpoint, a `ThreadTask`

1. decodes each input (an undecodable one, or one larger than `[inputs] max_bytes`, see
   `admission`, is
   parked with a `parked` receipt and the partition goes on: `OutputWriter.poison_records`);
2. folds the decoded ones with `step` into the checkpoint's `Overlay` over the
   partition's `RocksStore`, and returns the step's records (`OutputWriter`) and store
   changes, which the loop produces in the transaction;
3. after the commit, writes the overlay to RocksDB (one batch with the offsets) and only
   then hands the committed completion requests to the partition's `ModelStage`, whose
   `Completion` inputs go to `inputs` through a plain idempotent producer (the fold
   dedups them by message id, which is the request id). A completion that producer gave
   up on while the broker was away is sent again (`KafkaStageSink`).

When a partition starts (restored and checked) its stage re-issues the requests of
threads still `awaiting_model`; when it is revoked its model calls are cancelled. The
stages run on one asyncio loop in a daemon thread (`StageThread`), so a slow model never
holds a partition's offsets. `until_idle` stops once every owned partition is caught
up, no checkpoint is open, and no model call or completion is in flight.

With a `Tracing` (`--traces`), each input is folded in a `step` of its own inside a span
(`processors.tracing`), the records it causes carry that span's trace context, and the
model stage's provider and sink are wrapped to span each call; without one, nothing of
it runs and no record gets a header.

Fatal errors (fenced, a hung transaction call, an offset mismatch) propagate out of
`run`; the command line exits non-zero with their message.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from torpor.processors.admission import Refused, admit
from torpor.processors.fold.effects import RequestCompletion
from torpor.processors.fold.verify import Verifier
from torpor.processors.local import now_ms, tune_collector
from torpor.processors.models.provider import ModelProvider
from torpor.processors.models.stage import ModelStage, StageConfig, StageSink
from torpor.processors.observing import CommittedWork, ProcessorObserver
from torpor.processors.outputs import OutputWriter
from torpor.processors.restoring import RocksTarget
from torpor.processors.step import StepOutput, StepRecord, step
from torpor.processors.store.kv import Overlay, RocksStore, StoreOffsets
from torpor.processors.store.tables import HistoryAppend, HistoryCache
from torpor.processors.storedirs import partition_dir
from torpor.processors.trust import trust_for
from torpor.schemas.codec import Codec
from torpor.schemas.errors import ConfigError, DecodeError
from torpor.schemas.records import Input, ThreadConfig, ThreadEvent
from torpor.schemas.signer import Signer
from torpor.streams.clients import (
    Headers,
    OnDelivery,
    SentRecord,
    make_admin,
    make_consumer,
    make_producer,
    produce_again,
    sent_record,
)
from torpor.streams.config import Settings, producer_config
from torpor.streams.errors import is_transient_delivery_error
from torpor.streams.loop import CheckpointLoop, LoopSettings
from torpor.streams.partitioner import partition_for
from torpor.streams.renewal import ProducerRenewal
from torpor.streams.task import Change, InputRecord, OutputRecord, StoredOffsets, TaskOutput
from torpor.streams.topics import TopicNames

if TYPE_CHECKING:  # the optional extra `otel`: imported at run time only with tracing on
    from torpor.processors.tracing import FoldSpan, FoldTraces
    from torpor.streams.tracing import Tracing

log = logging.getLogger(__name__)

# Cancelling a partition's model calls on revoke waits at most this long: the calls are
# re-issued by the next owner anyway, so a stuck provider must not stall the rebalance.
CANCEL_SECONDS: Final = 5.0

# How long the stage's producer holds its records (live deltas to `events`, completions
# to `inputs`) before sending them (librdkafka's `linger.ms`, 5 by default). Each
# completion sends two, and at 5 ms few of them shared a produce request: each request
# costs the broker. 20 ms is nothing beside a model's own latency (bench/README.md,
# stop 25: with config.TRANSACTIONAL_LINGER_MS, ~37% fewer produce requests).
STAGE_LINGER_MS: Final = 20

SERVE_REPORTS_EVERY: Final = 512
"""The stage's producer serves its delivery reports every this many sends. librdkafka
keeps each message it sent until the report of its delivery is served, and nothing else
serves them while the processor runs (the loop polls its own transactional producer;
`_is_busy` polls this one, but only with `--until-idle`): a worker held up to 100,000
delivered messages (`queue.buffering.max.messages`), ~120 MiB, until a `BufferError`
made it flush them all at once, every ~40 s at full speed. Not at every send: `poll`
lets go of the GIL, which the loop's thread then holds for up to a switch interval. The
stage's loop serves them every `SERVE_REPORTS_S` too, for the reports that come while
nothing is sent."""

SERVE_REPORTS_S: Final = 1.0
"""The stage's loop also serves its producer's delivery reports this often, sends or not:
during a broker outage nothing is sent, and the report of a completion librdkafka gave up
on must still be served for the sink to send it again (`KafkaStageSink`)."""


@dataclass(frozen=True, slots=True)
class ProcessorConfig:
    """One processor instance: who it is, where its stores live, how it paces checkpoints."""

    instance: str
    store_dir: Path
    # The consumer group and the prefix of the transactional id: instances of one app share
    # the partitions; `<app>-<instance>` must be stable so a restart fences its predecessor.
    app: str = "torpor-processor"
    commit_interval: float = 0.2  # DESIGN 6: every 100-250 ms
    commit_every: int = 1000
    stage: StageConfig = field(default_factory=StageConfig)

    def __post_init__(self) -> None:
        if not self.instance.strip() or not self.app.strip():
            raise ConfigError("a processor needs a non-empty --instance (and app name)")

    @property
    def transactional_id(self) -> str:
        return f"{self.app}-{self.instance}"


class StageThread:
    """One asyncio loop on a daemon thread, where every partition's model stage runs."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="torpor-model-stage", daemon=True)
        self._thread.start()
        # Calls handed over but not run yet: part of "in flight". The first of a run wakes
        # the loop (`call_soon_threadsafe` writes to its self-pipe); the ones handed over
        # before it ran ride along. Each wake-up cost the caller a GIL hand-off: the
        # checkpoint loop's thread waited up to a switch interval to get the GIL back.
        self._pending: deque[Callable[[], object]] = deque()
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], object]) -> None:
        """Run `fn` on the stage loop soon (from any thread), after the calls handed over before it."""
        with self._lock:
            self._pending.append(fn)
            if len(self._pending) > 1:
                return  # a wake-up is on its way and runs this one too
        self._loop.call_soon_threadsafe(self._run_pending)

    def _run_pending(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    return
                fn = self._pending[0]
            try:
                fn()
            except Exception:  # one failing hand-over must not strand those queued behind it
                log.exception("a call handed to the model stage failed")
            finally:
                with self._lock:
                    self._pending.popleft()

    def wait(self, coroutine: Coroutine[object, object, None], timeout: float) -> None:
        """Run `coroutine` on the stage loop and wait for it, at most `timeout` seconds."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            future.result(timeout)
        except TimeoutError:
            future.cancel()
            log.warning("the model stage did not finish within %.1fs", timeout)

    @property
    def scheduled(self) -> int:
        return len(self._pending)

    def every(self, seconds: float, fn: Callable[[], object]) -> None:
        """Run `fn` on the stage loop every `seconds`, from now until the loop stops."""
        def tick() -> None:
            try:
                fn()
            except Exception:  # a failing tick must not end the ones after it
                log.exception("a periodic call on the model stage's loop failed")
            self._loop.call_later(seconds, tick)

        self._loop.call_soon_threadsafe(self._loop.call_later, seconds, tick)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=CANCEL_SECONDS)


class KafkaStageSink:
    """`StageSink` over a plain producer: live events to `events`, completions to `inputs`.

    A completion librdkafka gave up on for a reason that passes (the broker away longer than
    the delivery timeout: `errors.is_transient_delivery_error`) is sent again, the same
    bytes, until it is delivered or the producer closes: a copy that did arrive meanwhile is
    a duplicate of the same message id, which the fold absorbs. Before, the thread waited
    for the model until its partition moved or the worker restarted. A purge (the producer
    closing) or a refusal is logged, and the thread is asked again by the partition's next
    owner (`ModelStage.resume`). Live deltas are not sent again: they are ephemeral, and the
    turn's entry carries their text. `serve_reports` must be called periodically
    (`StageThread.every`), sends or not: the reports queue what to send again, and it sends
    it (`clients.produce_again`)."""

    def __init__(self, producer: Producer, topics: TopicNames, inputs_partitions: int, codec: Codec,
                 signer: Signer | None = None) -> None:
        self._producer = producer
        self._signer = signer
        self._events = topics.events
        self._inputs = topics.inputs
        self._partitions = inputs_partitions
        self._codec = codec
        self._sent = 0
        self._again: deque[tuple[SentRecord, OnDelivery]] = deque()  # see `serve_reports`

    def publish_event(self, event: ThreadEvent) -> None:
        # Keyed by thread: the producer's murmur2 partitioner puts it where the thread's records go.
        self._send(self._events, event.thread_id.encode(), self._codec.encode(self._events, event), -1, None)

    def publish_completion(self, completion: Input, headers: tuple[tuple[str, bytes], ...] = ()) -> None:
        if self._signer is not None:
            completion = self._signer.sign(completion)
        key = completion.thread_id.encode()
        listed: Headers = list(headers) if headers else None
        self._send(self._inputs, key, self._codec.encode(self._inputs, completion),
                   partition_for(key, self._partitions), listed, self._completion_delivered)

    @property
    def resending(self) -> int:
        """Completions whose delivery failed, waiting to be sent again (`serve_reports`)."""
        return len(self._again)

    def serve_reports(self) -> None:
        """Serve the producer's delivery reports, then send again the completions whose
        delivery failed (queued by their reports: `clients.produce_again` says why)."""
        self._producer.poll(0)
        produce_again(self._producer, self._again)

    def _completion_delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            return
        thread_id = (message.key() or b"").decode("utf-8", errors="replace")
        where = {"thread_id": thread_id, "topic": message.topic()}
        again = sent_record(message)
        if is_transient_delivery_error(error) and again is not None:
            log.warning("a completion was not delivered: %s; sending it again", error, extra=where)
            self._again.append((again, self._completion_delivered))  # sent by `serve_reports`
            return
        log.warning("a completion was not delivered: %s; the thread waits until its partition moves or this "
                    "worker restarts, and is asked again then", error, extra=where)

    def _send(self, topic: str, key: bytes, value: bytes, partition: int, headers: Headers,
              on_delivery: OnDelivery | None = None) -> None:
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, partition=partition, headers=headers,
                                       on_delivery=on_delivery)
                break
            except BufferError:
                # Full queue: send what it holds now (a flush does not wait out the linger,
                # STAGE_LINGER_MS; a poll would) and serve the delivery reports.
                self._producer.flush(0.05)
        self._sent += 1
        if self._sent % SERVE_REPORTS_EVERY == 0:
            self._producer.poll(0)  # frees the messages delivered so far (SERVE_REPORTS_EVERY)


class ThreadTask:
    """A `PartitionTask` for one `inputs` partition: `step` over its RocksDB store."""

    def __init__(self, partition: int, processor: Processor) -> None:
        self.partition = partition
        self._processor = processor
        self._target = RocksTarget(partition_dir(processor.config.store_dir, partition))
        self._overlay: Overlay | None = None
        self._requests: list[RequestCompletion] = []
        self._appended: list[HistoryAppend] = []  # for the stage's history cache, after the commit
        # What the open checkpoint folded here, held for the observer until it commits.
        self._steps: list[StepOutput] = []
        self._poisoned = 0
        self.stage: ModelStage | None = None

    @property
    def _store(self) -> RocksStore:
        return self._target.store

    def offsets(self) -> StoredOffsets:
        return self._target.offsets()

    def restore(self, changes: Sequence[Change], offsets: StoredOffsets) -> None:
        self._target.restore(changes, offsets)

    def start(self) -> None:
        observer = self._processor.observer
        stage = ModelStage(self._store, self._processor.provider, self._processor.sink, now_ms,
                           self._processor.config.stage, self._processor.histories, observer)
        self.stage = stage
        self._processor.stages.call(stage.resume)  # threads a previous owner left awaiting the model
        if observer is not None:
            observer.partition_started(self.partition, self._store, self.offsets().input_offset)

    def process(self, records: Sequence[InputRecord]) -> TaskOutput:
        overlay = self._overlay = self._overlay or Overlay(self._store)
        writer, codec, topic = self._processor.writer, self._processor.codec, self._processor.topics.inputs
        observed = self._processor.observer is not None
        traces = self._processor.traces  # None unless --traces: then one step, one span per input
        out: list[OutputRecord] = []
        changes: list[Change] = []
        run: list[StepRecord] = []
        originals = {r.offset: r for r in records}

        def fold_run(span: FoldSpan | None = None) -> None:
            if run:
                result = step(overlay, run, verifier=self._processor.verifier,
                              default_config=self._processor.default_config,
                              partitions=self._processor.inputs_partitions)
                produced = writer.step_records(result, originals)
                if span is not None and traces is not None:
                    produced = traces.carry(span, result, produced)
                out.extend(produced)
                changes.extend(result.changes)
                self._requests.extend(result.completions)
                self._appended.extend(result.appended)
                if observed:
                    self._steps.append(result)
                run.clear()

        def park(record: InputRecord, error: DecodeError, what: str) -> None:
            fold_run()  # keep partition order: what came before the poison folds first
            log.error("%s input parked: %s", what, error, extra={
                "partition": record.partition, "offset": record.offset, "disposition": "parked"})
            out.extend(writer.poison_records(record, error))
            self._poisoned += 1
            if traces is not None:
                traces.parked(record, str(error))

        limit = self._processor.max_input_bytes
        for record in records:
            admitted = admit(codec, topic, record.value, record.partition, record.offset, limit)
            if isinstance(admitted, Refused):
                park(record, admitted.error, admitted.what)
                continue
            run.append(StepRecord(admitted, record.partition, record.offset, record.key,
                                  record.timestamp if record.append_time else None))
            if traces is not None:
                span = traces.fold(record, admitted)
                try:
                    fold_run(span)
                finally:
                    span.end()
        fold_run()
        return TaskOutput(tuple(out), tuple(changes))

    def commit(self, offsets: StoredOffsets) -> None:
        if self._overlay is not None:
            self._overlay.commit(StoreOffsets(offsets.changelog_offset, offsets.input_offset))
            self._overlay = None
        requests, self._requests = self._requests, []
        appended, self._appended = self._appended, []
        steps, self._steps, poisoned, self._poisoned = self._steps, [], self._poisoned, 0
        observer = self._processor.observer
        if observer is not None:
            work = CommittedWork(self.partition, tuple(steps), poisoned, offsets.input_offset)
            observer.partition_committed(work, self._store)
        stage = self.stage
        if stage is not None and (requests or appended):
            # Committed now: the model may run (DESIGN 5). One hand-over per checkpoint,
            # not per request: each wakes the stage's loop across threads.
            # The cache is the stage thread's: it learns what was appended there, first.
            # A checkpoint with appends and no request (a turn's last answer) is handed
            # over too: left out, the thread's next request read those rows back.
            self._processor.stages.call(functools.partial(
                _submit_all, stage, requests, appended, self._processor.histories))

    def abort(self) -> None:
        if self._overlay is not None:
            self._overlay.abort()
            self._overlay = None
        self._requests = []
        self._appended = []
        self._steps, self._poisoned = [], 0

    def wipe(self) -> None:
        self._target.wipe()

    def close(self) -> None:
        if self.stage is not None:
            self._processor.stages.wait(self.stage.cancel(), CANCEL_SECONDS)
            self.stage = None
        if self._processor.observer is not None:
            self._processor.observer.partition_closed(self.partition)
        self._store.close()

    @property
    def in_flight(self) -> int:
        return self.stage.in_flight if self.stage is not None else 0


def _submit_all(stage: ModelStage, requests: Sequence[RequestCompletion],
                appended: Sequence[HistoryAppend], histories: HistoryCache) -> None:
    for each in appended:
        histories.extend(each)
    for request in requests:
        stage.submit(request)


class Processor:
    """Wires the loop, the tasks, the model stage and the clients of one instance."""

    def __init__(
        self,
        settings: Settings,
        config: ProcessorConfig,
        provider: ModelProvider,
        *,
        inputs_partitions: int,
        codec: Codec | None = None,
        verifier: Verifier | None = None,
        default_config: ThreadConfig | None = None,
        hosted_busy: Callable[[], bool] = lambda: False,
        observer: ProcessorObserver | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.observer = observer  # told of commits, partitions and completions (`observing`)
        self._hosted_busy = hosted_busy  # connectors hosted beside the processor (the CLI's)
        self.settings = settings
        self.config = config
        self.provider = provider
        self.topics = TopicNames.for_prefix(settings.topics.prefix)
        self.codec = codec or Codec.from_url(settings.schema_registry.url)
        trust = trust_for(settings.inputs)
        signer = trust.signer
        self.writer = OutputWriter(self.topics, inputs_partitions, self.codec, signer)
        self.verifier = verifier or trust.verifier
        self.max_input_bytes = settings.inputs.max_bytes
        self.default_config = default_config
        self.inputs_partitions = inputs_partitions
        self.stages = StageThread()
        self.histories = HistoryCache(config.stage.history_cache_entries)  # shared by the stages
        self._sink_producer = make_producer(settings, linger_ms=STAGE_LINGER_MS)
        sink = KafkaStageSink(self._sink_producer, self.topics, inputs_partitions, self.codec, signer)
        self.stages.every(SERVE_REPORTS_S, sink.serve_reports)
        self._stage_sink = sink
        self.sink: StageSink = sink
        self.traces: FoldTraces | None = None
        if tracing is not None:
            # Imported only when on: the OpenTelemetry SDK is an optional extra (`otel`).
            from torpor.processors.tracing import FoldTraces, TracedProvider, TracedSink

            self.traces = FoldTraces(tracing, self.topics.outbox)
            self.provider = TracedProvider(provider, self.traces)
            self.sink = TracedSink(sink, self.traces)
        self.tasks: dict[int, ThreadTask] = {}
        new_producer = functools.partial(make_producer, settings, transactional_id=config.transactional_id)
        producer_conf = producer_config(settings, transactional_id=config.transactional_id)
        expiry_ms = producer_conf["transaction.timeout.ms"]
        # A producer fenced by its own transaction's expiry (a leader failover) is renewed
        # in-process; one fenced by a successor with its instance id is not (streams/renewal.py).
        # So is a consumer that lost its static membership to a lost JoinGroup of its own.
        new_consumer = functools.partial(make_consumer, settings, config.app, instance_id=config.instance)
        renewal = ProducerRenewal(new_producer, make_admin(settings), config.app, config.instance,
                                  float(expiry_ms) / 1000, new_consumer)
        self.loop = CheckpointLoop(
            new_consumer(),
            new_producer(),
            make_consumer(settings, f"{config.app}.restore"),
            self._open_task,
            LoopSettings(self.topics.inputs, self.topics.changelog, commit_interval=config.commit_interval,
                         commit_every=config.commit_every),
            is_busy=self._is_busy,
            renewal=renewal,
            observer=observer,
        )

    def _open_task(self, partition: int) -> ThreadTask:
        task = ThreadTask(partition, self)
        self.tasks[partition] = task
        return task

    def high_watermark(self, partition: int) -> int | None:
        """The end of `inputs` partition `partition` (read_committed: its last stable offset)
        as the consumer last heard from the broker, or None when unknown. Cached, no request.
        Call it on the loop's thread (the metrics read it at commits): from another thread
        the call can wait behind the loop's `consume` for as long as the loop keeps polling."""
        try:
            found = self.loop.consumer.get_watermark_offsets(
                TopicPartition(self.topics.inputs, partition), cached=True)
        except (KafkaException, RuntimeError):  # RuntimeError: the consumer is closed
            return None
        if found is None:
            return None
        high: int = found[1]
        return high if high >= 0 else None

    def _is_busy(self) -> bool:
        self._sink_producer.poll(0)  # serve delivery reports so len() counts only the undelivered
        return (
            self.stages.scheduled > 0
            or any(task.in_flight for task in self.tasks.values() if task.stage is not None)
            or len(self._sink_producer) > 0
            or self._stage_sink.resending > 0
            or self._hosted_busy()
        )

    def run(self, should_stop: Callable[[], bool], *, until_idle: bool = False) -> None:
        """Fold until `should_stop()` (or idle, with `until_idle`); then close cleanly.

        Raises the loop's fatal errors (module docstring) after stopping the stage.
        The process is the processor's: its garbage collector is tuned (`tune_collector`).
        """
        tune_collector()
        try:
            self.loop.run(should_stop, until_idle=until_idle)
            self.loop.close()
        finally:
            self.stages.stop()
            # On any exit: the completions and live deltas the stage's producer still
            # holds (STAGE_LINGER_MS) go out, else the next owner pays those model calls again;
            # the ones queued to be sent again first (the stage's loop no longer serves them).
            self._stage_sink.serve_reports()
            self._sink_producer.flush(10.0)
