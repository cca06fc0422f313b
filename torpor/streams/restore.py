"""Restore a partition's store from the compacted changelog, and check it against the group.

Contract of `restore_partitions(consumer, changelog, targets, deadline)` (and of
`restore_partition`, its one-partition form):

1. It reads each changelog partition of `targets` with `consumer` (read_committed, never
   in a group: it only `assign`s), all of them at once, from the record after the store's
   `changelog_offset` (from offset 0 when the store is empty or was wiped) up to the
   partition's end, the last stable offset as read_committed sees it.
2. Each record is written to its store exactly as it is (key, value; a null value is a
   delete), in batches of `batch_size`, each batch with the offsets it reaches, so an
   interrupted restore resumes where it stopped.
3. The loop's checkpoint record (`CHECKPOINT_KEY`, header `CHECKPOINT_HEADER`) is not a
   store row: its value is the input offset its transaction committed, and it becomes
   the store's `input_offset`. The loop writes one per partition in every checkpoint,
   so the changelog alone says how far the inputs were folded, even when the store
   missed the last write batch (a crash between the commit and RocksDB).
4. A store that claims a changelog offset past the changelog's end (the changelog was
   deleted or recreated) is wiped, loudly, and restored from offset 0.

It returns a `RestoreResult` per partition. It raises `RetriableError` when the deadline
passes before the end is reached (a transaction of a dead previous owner can hold the
end back until the broker times it out), and `StoreCorruptedError` for a changelog
record without a key (someone else wrote to the changelog).

`check_offsets(stored, committed, ...)` is the gate before folding: the store's input
offset must equal the group's committed offset, or folding would apply inputs twice or
skip them. A mismatch after a complete restore cannot be repaired by restoring again, so
it raises `OffsetMismatchError`, which names both offsets and what to do.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition

from torpor.schemas.errors import RetriableError, StoreCorruptedError, TorporError
from torpor.streams import faults
from torpor.streams.deadline import Deadline
from torpor.streams.errors import is_transient_read_error, translate
from torpor.streams.task import Change, StoredOffsets

# The loop's per-partition checkpoint record on the changelog. Store layouts in Torpor
# begin every key with a 4-byte big-endian length (processors/keys.py); 0xFFFFFFFF would
# announce a 4 GiB thread id, which no Kafka record can carry, so this key never collides
# with a row. The header makes the record unambiguous to a reader that does not know that.
CHECKPOINT_KEY: Final = b"\xff\xff\xff\xfftorpor.checkpoint"
CHECKPOINT_HEADER: Final = "torpor.checkpoint"
_OFFSET: Final = struct.Struct(">q")

log: Final = logging.getLogger(__name__)

# Records written to the store per batch while restoring: big enough to amortise the
# write, small enough that an interrupted restore loses little work.
RESTORE_BATCH: Final = 1000
# One consume call's cap. consume() waits its whole timeout unless a full batch arrives,
# and a changelog usually ends in a commit marker that yields no record, so a long cap
# would be paid by every restore; short calls also let the deadline be checked often.
_POLL_CAP_SECONDS: Final = 0.05
# The pause before asking for a partition's watermarks again (its leader moving, say).
_READ_PAUSE_S: Final = 0.2


def encode_checkpoint(input_offset: int) -> bytes:
    """The value of a checkpoint record: the committed input offset, 8 bytes big-endian."""
    return _OFFSET.pack(input_offset)


def decode_checkpoint(value: bytes) -> int:
    """The input offset a checkpoint record carries. Raises StoreCorruptedError if malformed."""
    if len(value) != _OFFSET.size:
        raise StoreCorruptedError(f"a changelog checkpoint record holds {len(value)} bytes, not 8")
    offset: int = _OFFSET.unpack(value)[0]
    return offset


class RestoreTarget(Protocol):
    """The part of a `PartitionTask` that restore writes to."""

    def offsets(self) -> StoredOffsets: ...

    def restore(self, changes: Sequence[Change], offsets: StoredOffsets) -> None: ...

    def wipe(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What a restore did: the changelog range read and the offsets the store now holds."""

    partition: int
    from_offset: int
    end_offset: int
    records: int
    offsets: StoredOffsets


class OffsetMismatchError(TorporError):
    """The store's input offset differs from the group's committed offset after restore.

    Folding from either offset would apply inputs twice or skip some, and restoring again
    cannot help, so the processor refuses to run: it exits with this message. It happens when the changelog
    was deleted or truncated, or when someone reset the group's offsets by hand. To
    rebuild, stop every instance, then either restore the group's offsets to the store's
    or delete the changelog topic, the stores and the group together, and re-fold the
    inputs from the beginning.
    """


def check_offsets(topic: str, partition: int, stored: int | None, committed: int | None) -> None:
    """Refuse to fold unless the store's input offset equals the group's committed offset.

    Both None (a new partition) is in step. Raises OffsetMismatchError otherwise.
    """
    if stored == committed:
        return
    raise OffsetMismatchError(
        f"refusing to fold {topic}[{partition}]: the restored store says the next input is "
        f"{_describe(stored)} but the consumer group committed {_describe(committed)}. "
        "Folding now would apply inputs twice or skip them. If only this store is wrong, delete "
        "its directory: it rebuilds from the changelog. Otherwise stop every instance and either "
        "reset the group's offset to the store's, or delete the changelog, the stores and the "
        "group together and re-fold the inputs from the start."
    )


def _describe(offset: int | None) -> str:
    return "nothing (never folded)" if offset is None else f"offset {offset}"


def restore_partition(
    consumer: Consumer,
    changelog: str,
    partition: int,
    task: RestoreTarget,
    deadline: Deadline,
    *,
    batch_size: int = RESTORE_BATCH,
) -> RestoreResult:
    """Bring `task`'s store up to the end of changelog `partition` (module docstring)."""
    results = restore_partitions(consumer, changelog, {partition: task}, deadline, batch_size=batch_size)
    return results[partition]


@dataclass(slots=True)
class _Progress:
    """One partition's restore in progress."""

    target: RestoreTarget
    first: int
    end: int
    offsets: StoredOffsets
    pending: list[Change] = field(default_factory=list)
    count: int = 0
    position: int = 0

    def flush(self) -> None:
        if self.pending:
            self.target.restore(self.pending, self.offsets)
            self.pending = []
            faults.point("during_restore")


def restore_partitions(
    consumer: Consumer,
    changelog: str,
    targets: Mapping[int, RestoreTarget],
    deadline: Deadline,
    *,
    batch_size: int = RESTORE_BATCH,
) -> dict[int, RestoreResult]:
    """Restore several partitions at once, with one assignment (module docstring).

    Reading them together fetches them in parallel, and it avoids re-assigning one
    consumer partition after partition: librdkafka's fetch for the previous partition
    would sit out the broker's long poll before the next could start.
    """
    progress: dict[int, _Progress] = {}
    for partition, target in targets.items():
        low, end = _watermarks(consumer, TopicPartition(changelog, partition), deadline)
        start = target.offsets()
        first = 0 if start.changelog_offset is None else start.changelog_offset + 1
        if first > end:
            log.error(
                "store of %s[%d] holds changelog offset %s but the changelog ends at %d: the changelog "
                "was deleted or recreated. Wiping the store and restoring it from offset 0.",
                changelog, partition, start.changelog_offset, end, extra={"partition": partition},
            )
            target.wipe()
            start, first = target.offsets(), 0
        progress[partition] = _Progress(target, first, end, start, position=max(first, low))
    todo = {p: state for p, state in progress.items() if state.position < state.end}
    if todo:
        consumer.assign([
            TopicPartition(changelog, p, state.first if state.first > 0 else OFFSET_BEGINNING)
            for p, state in todo.items()
        ])
        try:
            _read_to_end(consumer, changelog, todo, deadline, batch_size)
        finally:
            consumer.unassign()
    return {p: RestoreResult(p, s.first, s.end, s.count, s.offsets) for p, s in progress.items()}


def _watermarks(consumer: Consumer, tp: TopicPartition, deadline: Deadline) -> tuple[int, int]:
    # With isolation.level=read_committed, the high watermark librdkafka reports is the
    # last stable offset: records of a transaction still open are not restorable yet.
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                tp, timeout=deadline.timeout_for_call(5.0), cached=False
            )
            return int(low), int(high)
        except KafkaException as exc:
            error = translate(exc, operation=f"get_watermark_offsets({tp.topic}[{tp.partition}])")
            if not (isinstance(error, RetriableError) or is_transient_read_error(exc)) or deadline.expired():
                raise error from exc
            time.sleep(min(_READ_PAUSE_S, deadline.remaining()))
            _refresh_leaders(consumer, tp.topic, deadline)


def _refresh_leaders(consumer: Consumer, topic: str, deadline: Deadline) -> None:
    """Ask for `topic`'s metadata, so the consumer learns where its partitions' leaders moved.

    A consumer idle since a broker died (the restore consumer between assignments) still
    sends its reads to the dead leader, and they time out: in the cluster kill test
    (tests/faults/test_cluster.py) get_watermark_offsets kept failing `_TIMED_OUT` for the
    whole 60 s restore deadline, while a restarted process with fresh clients restored at
    once. A metadata request updates librdkafka's cache. Failure is no news: the read retries.
    """
    if deadline.expired():
        return
    with contextlib.suppress(KafkaException):
        consumer.list_topics(topic, timeout=deadline.timeout_for_call(5.0))


def _read_to_end(
    consumer: Consumer, changelog: str, todo: dict[int, _Progress], deadline: Deadline, batch_size: int
) -> None:
    while any(state.position < state.end for state in todo.values()):
        if deadline.expired():
            for state in todo.values():
                state.flush()
            behind = {p: f"{s.position}/{s.end}" for p, s in todo.items() if s.position < s.end}
            raise RetriableError(
                f"restore of {changelog} partitions {behind} (offset reached/end) ran out of time; an "
                "open transaction of a previous owner may hold the end back until the broker aborts "
                "it (transaction.timeout.ms). Restore resumes from here."
            )
        for message in consumer.consume(batch_size, timeout=deadline.timeout_for_call(_POLL_CAP_SECONDS)):
            state = todo[message.partition() or 0]
            offset = _record(message, state.pending, changelog)
            state.position = max(state.position, offset + 1)
            if _is_checkpoint(message):
                state.offsets = StoredOffsets(offset, decode_checkpoint(message.value() or b""))
            else:
                state.offsets = StoredOffsets(offset, state.offsets.input_offset)
                state.count += 1
            if len(state.pending) >= batch_size:
                state.flush()
        # Transaction markers take offsets of their own and are never delivered; the
        # consumer's position moves past them, so it, not the last record, says "done".
        tps = [TopicPartition(changelog, p) for p in todo]
        for current in consumer.position(tps):
            state = todo[current.partition]
            state.position = max(state.position, current.offset)
    for state in todo.values():
        state.flush()


def _record(message: Message, pending: list[Change], changelog: str) -> int:
    error = message.error()
    if error is not None:
        raise translate(error, operation=f"restore consume {changelog}[{message.partition()}]")
    offset = message.offset()
    assert offset is not None  # a message without an error always has one
    if not _is_checkpoint(message):
        key = message.key()
        if key is None:
            raise StoreCorruptedError(
                f"changelog {changelog}[{message.partition()}] offset {offset} has no key; only the "
                "processor may write to the changelog. Wipe the store after removing the record's producer."
            )
        pending.append((key, message.value()))
    result: int = offset
    return result


def _is_checkpoint(message: Message) -> bool:
    headers = message.headers() or ()
    names = headers.keys() if isinstance(headers, dict) else [name for name, _ in headers]
    return message.key() == CHECKPOINT_KEY and CHECKPOINT_HEADER in names

