"""The transactional checkpoint loop: exactly-once folding of `inputs` partitions.

One `CheckpointLoop` per processor process owns one consumer (read_committed,
cooperative-sticky, static membership) and one transactional producer whose
`transactional.id` is stable per instance. It drives a `PartitionTask` per owned
partition (`streams/task.py`) through checkpoints. A checkpoint runs in five phases,
one method each, numbered here and in the bodies:

1. begin    `producer.begin_transaction()`, lazily, when the first record of a new
            checkpoint arrives (no empty transactions).
2. process  each polled batch, partition by partition, goes to that partition's task,
            which folds it into its overlay and returns records and store changes.
3. produce  the task's records, a changelog record per store change (same key, same
            value, to the input's partition number), and, at the commit, one checkpoint
            record per partition carrying the input offset the transaction commits
            (`restore.CHECKPOINT_KEY`).
4. commit   every `commit_interval` seconds or `commit_every` records, and as soon as
            a poll finds nothing more waiting once the checkpoint is `commit_linger` old
            (the next hop of a turn waits for this commit; under load the interval and
            size bound the transaction): `send_offsets_to_transaction` with fresh
            consumer group metadata (KIP-447: a zombie is fenced), flush (delivery
            failures abort), `commit_transaction`.
5. apply    only after the commit succeeded, each task writes its overlay to its store
            in one batch, with the changelog offset and the input offset it reaches.
            RocksDB may lag the transaction (restore catches it up), never lead it.

Failures, by what the loop does (classes from `torpor.schemas.errors`; the rules are
librdkafka's, applied by `txncalls.remedy`):

- a retriable error of a transaction call: call the SAME function again, after a backoff,
  while its budget lasts: `send_offsets_to_transaction` within the checkpoint's deadline,
  then the checkpoint is aborted; `commit_transaction` and `abort_transaction` within
  `resume_budget`, since a timed-out commit or abort keeps running in librdkafka and
  nothing but the same call may follow it (an abort then fails with `_CONFLICT`); past
  the budget they raise `RetriesExhaustedError` (fatal).
- `CheckpointAbortedError` (the error requires an abort, a record was not delivered, or
  a record was refused while folding because the transaction had failed under it, e.g.
  OUT_OF_ORDER_SEQUENCE_NUMBER after a leader failover: `errors.translate_produce`):
  `abort_transaction` (which also bumps the producer's epoch when the failure requires
  it), drop every overlay of the checkpoint, seek each partition back to its committed
  offset.
- a producer that fenced itself (`streams/renewal.py`): its transaction ran past
  `transaction.timeout.ms` during a leader failover and the coordinator aborted it, or a
  call hung past the watchdog, and no other member holds this instance's id. With a
  `ProducerRenewal`, the loop closes every partition dirty (overlays dropped), builds a
  new producer, runs `init_transactions` (which settles the old transaction) and restores
  the partitions as on assignment, seeking the consumer to the committed offsets. At most
  `MAX_RENEWALS` times in a row without a commit in between.
- a consumer that lost its static membership (`errors.ConsumerFencedError`, librdkafka's
  FENCED_INSTANCE_ID) while no other live member holds this instance's id, once a member
  id left by a lost JoinGroup of ours has expired (`renewal.py`): with a
  `ProducerRenewal` that can build consumers, the loop aborts the open checkpoint, closes
  every partition, replaces the consumer (same `group.instance.id`) and subscribes
  again; the rebalance that follows restores the partitions. At most `MAX_RENEWALS`
  times in a row without a commit in between.
- anything else, notably `FencedError`: raised out of `run`; the caller exits non-zero.
  A failure after the commit (while applying to the store) is fatal too: the store is
  merely behind, and the restart restores it from the changelog.

Every transaction call is bounded twice: by the timeout it is given, and by a watchdog
thread, because a librdkafka transaction call can overrun its own timeout. A call still
running at its deadline plus `watchdog_grace` raises `WatchdogExpiredError`: the
producer's state is unknown, so it is renewed (above) or the process exits; either way
`init_transactions` with the same id fences this producer and aborts whatever it left
open.

Partitions follow `lifecycle.PartitionLifecycle`. On assignment a partition's store is
restored from the changelog and checked against the group's committed offset before
anything is folded (`restore.py`); on revoke the open checkpoint is committed within
`revoke_budget`, or aborted, and the store closed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from torpor.schemas.errors import (
    CheckpointAbortedError,
    FencedError,
    RetriableError,
    TorporError,
)
from torpor.streams import faults
from torpor.streams.checkpoints import CheckpointObserver, QuietCheckpoints
from torpor.streams.deadline import Deadline
from torpor.streams.errors import (
    ConsumerFencedError,
    KafkaOperationError,
    is_transient_read_error,
    translate,
    translate_consume,
    translate_produce,
)
from torpor.streams.lifecycle import PartitionLifecycle, PartitionState
from torpor.streams.renewal import Membership, ProducerRenewal, is_own_expiry, may_rejoin
from torpor.streams.restore import (
    CHECKPOINT_HEADER,
    CHECKPOINT_KEY,
    check_offsets,
    encode_checkpoint,
    restore_partitions,
)
from torpor.streams.task import Change, InputRecord, OutputRecord, PartitionTask, StoredOffsets, TaskFactory
from torpor.streams.txncalls import TxnCall, WatchdogExpiredError, backoff, run_call

__all__ = ["CheckpointLoop", "LoopSettings", "WatchdogExpiredError"]

T = TypeVar("T")

log: Final = logging.getLogger(__name__)

_ANY_PARTITION: Final = -1

_OnDelivery = Callable[[KafkaError | None, Message], None]

# Renewals of the producer in a row, without a commit in between, before the loop gives up
# and exits: one failover needs one; more means the renewal does not help.
MAX_RENEWALS: Final = 3


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """How the loop paces checkpoints and bounds its calls. Seconds unless named otherwise."""

    inputs_topic: str
    changelog_topic: str
    # DESIGN section 6: commit every 100-250 ms. Shorter costs a transaction round trip
    # per commit; longer delays every effect (and every model call) by as much.
    commit_interval: float = 0.2
    # Or after this many records, so a burst does not build one huge transaction.
    commit_every: int = 1000
    # When nothing more is waiting, a checkpoint commits once it is this old: inputs that
    # trickle in (a connector answering one call at a time) share a transaction instead
    # of paying a commit each, for at most this much latency per hop. bench.kafka (500
    # agents, one process): 0.01 s gave 431-564 checkpoint records and 459-483/s, 0.05 s
    # 245-302 and 484-553/s, 0.1 s 236 and 438/s (noisy: shared cores). With a worker per
    # core the hop's latency, not the CPU, bounds a wave; 0.02 s, with the producers'
    # lingers (config.TRANSACTIONAL_LINGER_MS, processor.STAGE_LINGER_MS), took 2,000 x 20
    # from ~2,600 to ~3,000/s without more transactions (bench/README.md, stop 25).
    commit_linger: float = 0.02
    # Records per consume() call: one batch is folded partition by partition.
    max_batch: int = 500
    # How long the loop blocks for the next record when nothing is waiting; bounds the
    # stop latency. A record that arrives ends the wait at once.
    poll_timeout: float = 0.1
    # The budget of one transaction phase (flush, send offsets, commit, abort).
    transaction_timeout: float = 10.0
    # How far past its deadline a call may run before the watchdog declares it hung. Above
    # a leader failover (a 9 s broker session timeout, then an election): with 5 s, the
    # watchdog ended send_offsets_to_transaction calls blocked on a moving coordinator
    # (5.1-12 s in all) in the three-node kill test (tests/faults/test_cluster.py).
    watchdog_grace: float = 20.0
    # How long a commit or abort that keeps failing retriably (the broker away, its
    # coordinator moving) is resumed before the process gives up and exits. Long enough
    # for a broker restart or a leader election; the transaction itself times out on the
    # broker after transaction.timeout.ms, and the resumed call then reports that.
    resume_budget: float = 300.0
    # Revoke: commit or abort the open checkpoint within this budget, then close.
    revoke_budget: float = 10.0
    # Restore of one partition on assignment; a dead owner's open transaction can hold
    # the changelog's end back for up to transaction.timeout.ms (10 s by default).
    restore_timeout: float = 60.0
    # How long a fenced consumer waits for the member id holding its instance id to go
    # (`renewal.ProducerRenewal.released`) before the loop exits. Above the consumer's
    # session.timeout.ms (45 s by default), within which a member id left by a lost
    # JoinGroup of ours expires; a live successor's never does.
    rejoin_wait: float = 60.0

    def __post_init__(self) -> None:
        for name in ("commit_interval", "poll_timeout", "transaction_timeout", "watchdog_grace",
                     "resume_budget", "revoke_budget", "restore_timeout", "rejoin_wait"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"LoopSettings.{name} must be positive, got {value!r}")
        if not 0 <= self.commit_linger <= self.commit_interval:
            raise ValueError("LoopSettings.commit_linger must be between 0 and commit_interval")
        if self.commit_every < 1 or self.max_batch < 1:
            raise ValueError("LoopSettings.commit_every and max_batch must be at least 1")


@dataclass(slots=True)
class _Owned:
    """One partition this instance owns: its lifecycle, its task, its committed offset."""

    lifecycle: PartitionLifecycle
    task: PartitionTask
    # The next input offset the last commit covers (None: nothing committed yet).
    committed: int | None
    # The changelog offset of the last record the store holds.
    changelog_offset: int | None


@dataclass(slots=True)
class _Checkpoint:
    """The open transaction: what it has folded, per partition, since `begin`."""

    started: float
    records: int = 0
    next_offsets: dict[int, int] = field(default_factory=dict)
    # The offset of each partition's checkpoint record, the last changelog record the
    # transaction writes there (delivery reports): what phase 5 stores as reached.
    changelog_acked: dict[int, int] = field(default_factory=dict)
    delivery_error: KafkaError | None = None

    def delivered(self, error: KafkaError | None, message: Message) -> None:
        """librdkafka's delivery report of a checkpoint record.

        Only checkpoint records ask for one: a Python call per record cost the loop's
        thread some 2,000 calls a checkpoint. Any other record that fails fails the
        transaction (librdkafka makes it abortable: "N message(s) failed delivery"), so
        `send_offsets_to_transaction` or `commit_transaction` reports it.
        """
        if error is not None:
            self.delivery_error = self.delivery_error or error
            return
        part, offset = message.partition(), message.offset()
        if part is not None and offset is not None:
            self.changelog_acked[part] = max(offset, self.changelog_acked.get(part, -1))


class CheckpointLoop:
    """Runs the checkpoints of one processor instance (see the module docstring)."""

    def __init__(
        self,
        consumer: Consumer,
        producer: Producer,
        restore_consumer: Consumer,
        task_factory: TaskFactory,
        settings: LoopSettings,
        *,
        is_busy: Callable[[], bool] = lambda: False,
        renewal: ProducerRenewal | None = None,
        observer: CheckpointObserver | None = None,
    ) -> None:
        self._observer = observer or QuietCheckpoints()  # told of each commit and abort (metrics)
        self._consumer = consumer
        self._producer = producer
        self._restore_consumer = restore_consumer
        self._task_factory = task_factory
        self._settings = settings
        self._is_busy = is_busy  # work outside the loop still in flight (the model stage)
        self._owned: dict[int, _Owned] = {}
        self._checkpoint: _Checkpoint | None = None
        self._renewal = renewal
        # When the producer's open transaction began (monotonic), until it commits or aborts.
        self._transaction_started: float | None = None
        self._renewals_in_a_row = 0
        self._rejoins_in_a_row = 0
        self._assigned_once = False
        self.commits = 0
        self.aborts = 0
        self.renewals = 0
        self.rejoins = 0

    @property
    def consumer(self) -> Consumer:
        """The group consumer now in use: a rejoin after FENCED_INSTANCE_ID replaces it."""
        return self._consumer

    # --- running ------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool], *, until_idle: bool = False) -> None:
        """Fold until `should_stop()` (or, with `until_idle`, until caught up and idle).

        Raises whatever is fatal (module docstring); on a clean stop the open checkpoint
        is committed and the stores are closed.
        """
        settings = self._settings
        self._call(TxnCall.INIT, self._producer.init_transactions,
                   Deadline.after(settings.transaction_timeout))
        self._subscribe()
        while not should_stop():
            # What is fetched already, without waiting: librdkafka's consume() blocks for
            # its whole timeout unless the batch fills, which cost every checkpoint (and
            # so every hop of a turn) the poll timeout.
            messages = self._consumer.consume(settings.max_batch, timeout=0)
            if messages:
                self._fold(messages)
            lingered = self._lingered()
            if self._is_due() or (not messages and lingered is not None and lingered <= 0):
                # Due by time or size under load; and as soon as nothing more is waiting
                # (after `commit_linger`): the records of this checkpoint are what the
                # next hop (the model stage, a connector, a reader of receipts) waits for.
                self._renewing(lambda: self.commit_checkpoint(Deadline.after(settings.transaction_timeout)))
                lingered = None
            if messages:
                continue
            # Delivery reports (and librdkafka's logs) are served here and by the commit's
            # flush, not on every pass: each call lets go of the GIL, and under load the
            # model stage's thread took it for up to a switch interval (5 ms) each time.
            self._producer.poll(0)
            if until_idle and self._is_idle():
                log.info("caught up and idle: stopping", extra={"partition": sorted(self._owned)})
                break
            # Nothing waiting: block until one record arrives (a batch of one returns at
            # once), at most the poll timeout (which bounds the stop latency) or what is
            # left of the linger of the open checkpoint.
            wait = settings.poll_timeout if lingered is None else min(settings.poll_timeout, lingered)
            first = self._consumer.consume(1, timeout=wait)
            if first:
                # Its fetch usually brought company: fold them together. Folded alone, the
                # first record cost a step of its own (0.5-1.4 ms under bench.kafka, once per
                # wait that ended with a record).
                more = settings.max_batch - 1
                self._fold(first + self._consumer.consume(more, timeout=0) if more else first)
        self._renewing(lambda: self.commit_checkpoint(Deadline.after(settings.transaction_timeout)))

    def _subscribe(self) -> None:
        self._consumer.subscribe(
            [self._settings.inputs_topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def close(self) -> None:
        """Leave the group and close every store (clean: nothing is open any more)."""
        self._consumer.close()  # runs _on_revoke for what is still owned
        for partition in list(self._owned):
            self._close_partition(partition)

    def _fold(self, messages: list[Message]) -> None:
        by_partition: dict[int, list[InputRecord]] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                failure = translate_consume(error)
                if isinstance(failure, ConsumerFencedError):
                    self._rejoin(failure)  # the batch goes with the consumer: restore seeks anew
                    return
                raise failure
            record = _record_of(message)
            owned = self._owned.get(record.partition)
            if owned is None or not owned.lifecycle.is_running():
                continue  # fetched just before a revoke: the new owner folds it
            by_partition.setdefault(record.partition, []).append(record)
        if by_partition:
            self._renewing(lambda: self._fold_records(by_partition))

    def _fold_records(self, by_partition: dict[int, list[InputRecord]]) -> None:
        checkpoint = self._checkpoint or self.begin()
        try:
            for partition, records in by_partition.items():
                self.process(checkpoint, partition, records)
        except CheckpointAbortedError as error:
            # The transaction failed under the fold (a record refused, the queue full): abort
            # it as a failed commit would. Every partition of the batch is sought back too,
            # folded yet or not: the consumer's position is past all of them.
            self._abort(checkpoint, error, also=by_partition)

    # --- phase 1: begin -----------------------------------------------------------

    def begin(self) -> _Checkpoint:
        """Phase 1: open a transaction for the next checkpoint."""
        faults.point("before_begin")
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise translate(exc, operation="begin_transaction") from exc
        self._transaction_started = time.monotonic()
        self._checkpoint = _Checkpoint(time.monotonic())
        return self._checkpoint

    # --- phases 2 and 3: process, produce ------------------------------------------

    def process(self, checkpoint: _Checkpoint, partition: int, records: list[InputRecord]) -> None:
        """Phase 2: fold `records` into the partition's overlay; phase 3: produce the results."""
        output = self._owned[partition].task.process(records)
        self._produce_all(output.records)
        self._produce_changes(partition, output.changes)
        faults.point("mid_transaction")
        checkpoint.records += len(records)
        checkpoint.next_offsets[partition] = records[-1].offset + 1

    # Some 16 records a completion go through these two: librdkafka's `produce` is called
    # with positional arguments, which its binding parses ~0.5 us faster than keywords, and
    # no record is built for a changelog row. A record that finds the queue full, and
    # those after it, go through `_produce`, which waits for room.

    def _produce_all(self, records: Sequence[OutputRecord]) -> None:
        produce = self._producer.produce
        done = 0
        try:
            for out in records:
                if out.headers:
                    self._produce(out)
                else:  # -1 is librdkafka's "let the partitioner choose" (murmur2, by key)
                    chosen = _ANY_PARTITION if out.partition is None else out.partition
                    produce(out.topic, out.value, out.key, chosen)
                done += 1
        except BufferError:
            for out in records[done:]:
                self._produce(out)
        except KafkaException as exc:
            raise translate_produce(exc, topic=records[done].topic) from exc

    def _produce_changes(self, partition: int, changes: Sequence[Change]) -> None:
        """Each store change as a changelog record: same key and value, the input's partition number."""
        produce, changelog = self._producer.produce, self._settings.changelog_topic
        done = 0
        try:
            for key, value in changes:
                produce(changelog, value, key, partition)
                done += 1
        except BufferError:
            for key, value in changes[done:]:
                self._produce(OutputRecord(changelog, key, value, partition=partition))
        except KafkaException as exc:
            raise translate_produce(exc, topic=changelog) from exc

    def _produce(self, out: OutputRecord, on_delivery: _OnDelivery | None = None) -> None:
        # A checkpoint produces some thousands of records: a deadline only once the queue is
        # found full, and a delivery report only when asked for (the checkpoint records).
        deadline: Deadline | None = None
        while True:
            try:
                self._producer.produce(
                    out.topic, value=out.value, key=out.key,
                    # -1 is librdkafka's "let the partitioner choose" (murmur2, by key).
                    partition=_ANY_PARTITION if out.partition is None else out.partition,
                    headers=list(out.headers) if out.headers else None, on_delivery=on_delivery,
                )
                return
            except BufferError:
                # The local queue is full: send what it holds now (a flush does not wait out
                # the linger, config.TRANSACTIONAL_LINGER_MS; a poll would), serve the
                # delivery reports, then retry.
                deadline = deadline or Deadline.after(self._settings.transaction_timeout)
                if deadline.expired():
                    raise CheckpointAbortedError(
                        f"the producer queue stayed full for {self._settings.transaction_timeout}s"
                    ) from None
                self._producer.flush(0.05)
            except KafkaException as exc:
                raise translate_produce(exc, topic=out.topic) from exc

    # --- phase 4: commit; phase 5: apply --------------------------------------------

    def _lingered(self) -> float | None:
        """Seconds the open checkpoint should still wait for company (None: none is open)."""
        checkpoint = self._checkpoint
        if checkpoint is None:
            return None
        return self._settings.commit_linger - (time.monotonic() - checkpoint.started)

    def _is_due(self) -> bool:
        checkpoint = self._checkpoint
        if checkpoint is None:
            return False
        elapsed = time.monotonic() - checkpoint.started
        return elapsed >= self._settings.commit_interval or checkpoint.records >= self._settings.commit_every

    def commit_checkpoint(self, deadline: Deadline) -> bool:
        """Phases 3-5 of the open checkpoint, if any. Returns False if it had to be aborted.

        Raises fatal errors (fenced, hung, a store that cannot be written after the commit).
        """
        checkpoint = self._checkpoint
        if checkpoint is None:
            return True
        started = time.monotonic()
        try:
            for partition, offset in checkpoint.next_offsets.items():  # phase 3, the last records
                self._produce(OutputRecord(
                    self._settings.changelog_topic, CHECKPOINT_KEY, encode_checkpoint(offset),
                    partition=partition, headers=((CHECKPOINT_HEADER, b""),),
                ), checkpoint.delivered)
            self._commit(checkpoint, deadline)  # phase 4
        except (CheckpointAbortedError, RetriableError) as error:
            self._abort(checkpoint, error)
            return False
        self._checkpoint = None
        self._transaction_started = None
        self._renewals_in_a_row = self._rejoins_in_a_row = 0
        faults.point("after_commit_before_store")
        self._apply(checkpoint)  # phase 5
        self.commits += 1
        self._observer.committed(time.monotonic() - started)
        return True

    def _commit(self, checkpoint: _Checkpoint, deadline: Deadline) -> None:
        """Phase 4: send the offsets with fresh group metadata, flush, commit.

        The offsets go first. The flush then sends what the producer still holds (it
        holds a checkpoint's records up to `config.TRANSACTIONAL_LINGER_MS`, so most of a
        short checkpoint's records go out here, in one request per partition) and waits
        for their delivery, serving the reports on this thread: a failed one aborts, and
        the changelog offsets they carry are what phase 5 writes to the store.
        """
        inputs = self._settings.inputs_topic
        offsets = [TopicPartition(inputs, p, o) for p, o in checkpoint.next_offsets.items()]
        metadata = self._consumer.consumer_group_metadata()
        self._call(TxnCall.SEND_OFFSETS,
                   lambda timeout: self._producer.send_offsets_to_transaction(offsets, metadata, timeout),
                   deadline)
        self._flush(deadline)
        if checkpoint.delivery_error is not None:
            error = translate(checkpoint.delivery_error, operation="deliver a checkpoint record")
            if isinstance(error, FencedError):
                raise error
            raise CheckpointAbortedError(str(error)) from error
        faults.point("before_commit")
        # Not the checkpoint's deadline: a commit that timed out can only be resumed.
        self._call(TxnCall.COMMIT, self._producer.commit_transaction, self._resume_deadline(deadline))

    def _flush(self, deadline: Deadline) -> None:
        while True:
            remaining = self._producer.flush(deadline.timeout_for_call(1.0))
            if remaining == 0:
                return
            if deadline.expired():
                raise CheckpointAbortedError(f"{remaining} records were undelivered at the commit deadline")

    def _apply(self, checkpoint: _Checkpoint) -> None:
        """Phase 5: the transaction is durable; write each overlay to its store in one batch."""
        for partition, offset in checkpoint.next_offsets.items():
            owned = self._owned.get(partition)
            if owned is None:
                continue
            changelog_offset = checkpoint.changelog_acked.get(partition, owned.changelog_offset)
            owned.task.commit(StoredOffsets(changelog_offset, offset))
            owned.committed = offset
            owned.changelog_offset = changelog_offset
            faults.point("mid_store_write")

    def _abort(self, checkpoint: _Checkpoint, error: TorporError, also: Iterable[int] = ()) -> None:
        """Abort the transaction, drop the overlays, seek back to the committed offsets.

        The checkpoint's partitions are sought back, and `also` those of a batch it did not
        finish folding.
        """
        partitions = sorted({*checkpoint.next_offsets, *also})
        log.warning("aborting checkpoint: %s", error, extra={"partition": partitions})
        self._checkpoint = None
        self.aborts += 1
        self._observer.aborted(type(error).__name__)
        self._call(TxnCall.ABORT, self._producer.abort_transaction,
                   Deadline.after(self._settings.resume_budget))
        self._transaction_started = None
        for partition in partitions:
            owned = self._owned.get(partition)
            if owned is None:
                continue
            owned.task.abort()
            if not owned.lifecycle.is_running():
                continue  # being revoked: its next owner starts from the committed offset anyway
            start = OFFSET_BEGINNING if owned.committed is None else owned.committed
            self._consumer.seek(TopicPartition(self._settings.inputs_topic, partition, start))

    # --- the watchdog ---------------------------------------------------------------

    def _call(self, call: TxnCall, fn: Callable[[float], T], budget: Deadline) -> T:
        """Run a transaction call by librdkafka's rules (`txncalls.run_call`) under the watchdog.

        Raises CheckpointAbortedError (abort the checkpoint) or a fatal error (exit).
        """
        settings = self._settings
        return run_call(call, fn, per_call=settings.transaction_timeout, budget=budget,
                        grace=settings.watchdog_grace)

    def _resume_deadline(self, deadline: Deadline) -> Deadline:
        """The later of `deadline` and `resume_budget` from now."""
        resume = Deadline.after(self._settings.resume_budget)
        return resume if resume.expires_at > deadline.expires_at else deadline

    # --- renewing a producer that fenced itself ------------------------------------------

    def _renewing(self, phase: Callable[[], object]) -> None:
        """Run a phase that calls the producer; renew the producer if it fenced itself."""
        try:
            phase()
        except ConsumerFencedError as error:  # offsets sent with a fenced member's metadata
            self._rejoin(error)
        except (FencedError, KafkaOperationError) as error:
            if not self._may_renew(error):
                raise
            self._renew(error)

    def _may_renew(self, error: TorporError) -> bool:
        """Whether `error` is this producer's own expiry, not a successor's fence (`renewal.py`)."""
        renewal = self._renewal
        if renewal is None or self._renewals_in_a_row >= MAX_RENEWALS:
            return False
        if not all(owned.lifecycle.is_running() for owned in self._owned.values()):
            return False  # mid-rebalance: exit as before, the restart rejoins cleanly
        started = self._transaction_started
        age = None if started is None else time.monotonic() - started
        if not is_own_expiry(error, age, renewal.transaction_expiry):
            return False
        holder = renewal.holder(self._consumer.memberid(), Deadline.after(self._settings.restore_timeout))
        if holder in (Membership.REPLACED, Membership.UNKNOWN):
            log.error("not renewing the producer: instance %s is %s in group %s", renewal.instance_id,
                      holder.value, renewal.group_id)
            return False
        return True

    def _renew(self, error: TorporError) -> None:
        """Close every partition dirty, start a new producer, restore and seek back (`renewal.py`)."""
        renewal = self._renewal
        assert renewal is not None  # _may_renew said so
        partitions = sorted(self._owned)
        # "aborting checkpoint" is what the fault harness looks for after a zombie wakes.
        log.warning("aborting checkpoint: %s. The producer fenced itself (its transaction outlived "
                    "transaction.timeout.ms, or a call hung) and no other member holds its instance id: "
                    "closing the partitions dirty, starting a new producer and restoring them",
                    error, extra={"partition": partitions})
        if self._checkpoint is not None:
            self._checkpoint = None
            self.aborts += 1
            self._observer.aborted(type(error).__name__)
        self._transaction_started = None
        self._renewals_in_a_row += 1
        for partition in partitions:
            self._owned[partition].task.abort()
            self._close_partition(partition)
        # The old producer is dropped, not closed: a hung call may still hold it. The new
        # one's init_transactions fences it and settles its transaction (aborts it, or
        # completes a commit the coordinator had prepared); restore then reads the outcome.
        self._producer = renewal.new_producer()
        self._call(TxnCall.INIT, self._producer.init_transactions,
                   Deadline.after(self._settings.resume_budget))
        for start in self._open(partitions):
            self._consumer.seek(start)
        self.renewals += 1
        log.info("producer renewed (%d in a row); partitions restored", self._renewals_in_a_row,
                 extra={"partition": partitions})

    # --- rebuilding a consumer that lost its static membership --------------------------

    def _rejoin(self, error: ConsumerFencedError) -> None:
        """Replace a fenced consumer if no other live member holds our instance id (`renewal.py`).

        Raises `error` when it may not: a successor holds the id, the group did not answer,
        or rebuilding did not help `MAX_RENEWALS` times in a row.
        """
        renewal = self._renewal
        if renewal is None or renewal.new_consumer is None or self._rejoins_in_a_row >= MAX_RENEWALS:
            raise error
        # The partitions are lost whatever comes next. Abort first: an open transaction holds
        # back read_committed readers while the group is asked, and a producer a successor
        # fenced fails here, which ends a zombie at once.
        partitions = sorted(self._owned)
        for partition in partitions:  # no seek on the fenced consumer: the new one starts afresh
            lifecycle = self._owned[partition].lifecycle
            if lifecycle.state is not PartitionState.REVOKING:
                lifecycle.transition_to(PartitionState.REVOKING)
        if self._checkpoint is not None:
            self._abort(self._checkpoint, error)
        for partition in partitions:
            self._owned[partition].task.abort()
            self._close_partition(partition)
        holder = renewal.released(self._consumer.memberid(), Deadline.after(self._settings.rejoin_wait))
        if not may_rejoin(holder):
            log.error("not rebuilding the consumer: instance %s is %s in group %s", renewal.instance_id,
                      holder.value, renewal.group_id)
            raise error
        log.warning("rebuilding the consumer: %s. No other live member holds instance %s (%s): joining the "
                    "group again", error, renewal.instance_id, holder.value, extra={"partition": partitions})
        self._rejoins_in_a_row += 1
        try:
            self._consumer.close()  # fatal: it neither commits nor leaves; owns nothing now
        except (KafkaException, RuntimeError) as exc:
            log.info("closing the fenced consumer: %s", exc)
        self._consumer = renewal.new_consumer()
        self._assigned_once = False  # owning nothing until the rebalance is not being idle
        self._subscribe()
        self.rejoins += 1
        log.info("consumer rebuilt (%d in a row); the rebalance restores the partitions",
                 self._rejoins_in_a_row)

    # --- rebalancing ------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Restore and check each new partition, then start fetching it at the checked offset."""
        self._assigned_once = True
        if not partitions:
            return
        consumer.incremental_assign(self._open([tp.partition for tp in partitions]))

    def _open(self, partitions: list[int]) -> list[TopicPartition]:
        """Open, restore and check each partition; return where the consumer starts each one."""
        settings = self._settings
        opened: dict[int, _Owned] = {}
        for partition in partitions:
            lifecycle = PartitionLifecycle(settings.inputs_topic, partition)
            opened[partition] = self._owned[partition] = _Owned(
                lifecycle, self._task_factory(partition), None, None
            )
            lifecycle.transition_to(PartitionState.RESTORING)
        deadline = Deadline.after(settings.restore_timeout)
        results = restore_partitions(
            self._restore_consumer, settings.changelog_topic,
            {p: owned.task for p, owned in opened.items()}, deadline,
        )
        starts: list[TopicPartition] = []
        for partition, owned in opened.items():
            result = results[partition]
            committed = self._committed_offset(partition, deadline)
            check_offsets(settings.inputs_topic, partition, result.offsets.input_offset, committed)
            owned.committed = committed
            owned.changelog_offset = result.offsets.changelog_offset
            owned.lifecycle.transition_to(PartitionState.RUNNING)
            owned.task.start()
            log.info("partition restored (%d changelog records from offset %d), folding from %s",
                     result.records, result.from_offset, committed,
                     extra={"partition": partition, "offset": committed})
            start = OFFSET_BEGINNING if committed is None else committed
            starts.append(TopicPartition(settings.inputs_topic, partition, start))
        return starts

    def _committed_offset(self, partition: int, deadline: Deadline) -> int | None:
        tp = TopicPartition(self._settings.inputs_topic, partition)
        attempt = 0
        while True:
            try:
                (found,) = self._consumer.committed([tp], timeout=deadline.timeout_for_call(10.0))
            except KafkaException as exc:
                error = translate(exc, operation=f"committed({tp.topic}[{partition}])")
                again = isinstance(error, RetriableError) or is_transient_read_error(exc)
                if again and not deadline.expired():
                    attempt += 1
                    time.sleep(min(backoff(attempt), deadline.remaining()))
                    continue
                raise error from exc
            offset: int = found.offset
            return None if offset == OFFSET_INVALID or offset < 0 else offset

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Commit (or abort) the open checkpoint within the revoke budget, then close."""
        revoked = [tp.partition for tp in partitions if tp.partition in self._owned]
        for partition in revoked:
            self._owned[partition].lifecycle.transition_to(PartitionState.REVOKING)
        faults.point("on_revoke")
        # With cooperative-sticky, librdkafka can run this callback while the group's
        # generation moves on, and the commit then fails with ILLEGAL_GENERATION
        # (confluentinc/librdkafka#4059; seen in tests/streams/test_loop.py). That is an
        # abortable failure: the checkpoint is aborted and its inputs are folded again,
        # here or by the new owner. Correct, at the cost of one checkpoint per rebalance.
        self.commit_checkpoint(Deadline.after(self._settings.revoke_budget))
        for partition in revoked:
            self._close_partition(partition)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Lost, not revoked: another member may own them already, so commit nothing."""
        lost = [tp.partition for tp in partitions if tp.partition in self._owned]
        for partition in lost:
            self._owned[partition].lifecycle.transition_to(PartitionState.REVOKING)
        if self._checkpoint is not None:
            self._abort(self._checkpoint, CheckpointAbortedError(f"partitions {lost} were lost"))
        for partition in lost:
            self._close_partition(partition)

    def _close_partition(self, partition: int) -> None:
        owned = self._owned.pop(partition)
        if owned.lifecycle.state is not PartitionState.REVOKING:
            owned.lifecycle.transition_to(PartitionState.REVOKING)
        owned.task.close()
        owned.lifecycle.transition_to(PartitionState.CLOSED)
        log.info("partition closed", extra={"partition": partition, "offset": owned.committed})

    # --- idleness -------------------------------------------------------------------

    def _is_idle(self) -> bool:
        """Caught up on every owned partition, nothing open, nothing in flight elsewhere."""
        if not self._assigned_once or self._checkpoint is not None or self._is_busy():
            return False
        for partition, owned in self._owned.items():
            if not owned.lifecycle.is_running():
                return False
            tp = TopicPartition(self._settings.inputs_topic, partition)
            try:
                # read_committed: the high watermark is the last stable offset.
                _, end = self._consumer.get_watermark_offsets(tp, timeout=5.0, cached=False)
                (position,) = self._consumer.position([tp])
            except KafkaException:
                return False  # cannot tell now; the next idle poll asks again
            reached = max(position.offset, owned.committed or 0)
            if reached < end:
                return False
        return True

    @property
    def owned_partitions(self) -> list[int]:
        """The partitions this instance owns now, in order."""
        return sorted(self._owned)


def _record_of(message: Message) -> InputRecord:
    kind, timestamp = message.timestamp()
    return InputRecord(
        topic=message.topic() or "",
        partition=message.partition() or 0,
        offset=message.offset() or 0,
        key=message.key(),
        value=message.value(),
        timestamp=max(int(timestamp), 0),
        append_time=kind == TIMESTAMP_LOG_APPEND_TIME,
        headers=_headers(message),
    )


def _headers(message: Message) -> tuple[tuple[str, str | bytes | None], ...] | None:
    # librdkafka builds the list only for a record that has headers: None costs nothing.
    found = message.headers()
    return tuple(found) if isinstance(found, list) and found else None
