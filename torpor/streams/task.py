"""The seam between the transactional loop and what it runs: a `PartitionTask` per partition.

`streams/loop.py` knows Kafka and exactly-once; it does not know what a record means.
For each `inputs` partition it owns it asks a `TaskFactory` for a `PartitionTask`, which
holds that partition's store and an overlay over it, and drives it through one
checkpoint at a time:

    task.start()               restored and checked against the group: folding begins
    task.process(records)      fold the records into the overlay; return what to produce
                               and the store changes (the loop mirrors them to the changelog)
    ... the loop produces, sends offsets, commits ...
    task.commit(offsets)       write the overlay and `offsets` to the store in one batch
    (or task.abort())          drop the overlay: the store never saw it

The loop owns the changelog and the offsets; the task owns the store's key layout and
everything it decides. A task never touches Kafka, so local mode and tests can drive it
without a broker. Bad *records* are the task's business (it parks them and emits a
receipt as ordinary output); an exception out of `process` is a bug, and the loop exits.

Implemented by `torpor.processors.processor.ThreadTask` (the agent fold) and, in the
tests, by a counter per key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from torpor.schemas.frozen import fast_inits

Change = tuple[bytes, bytes | None]
"""One store write: the key and its new value, or None for a delete (a changelog tombstone)."""


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One consumed record, detached from librdkafka: where it was and its raw bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int  # ms since the epoch as the broker reported it; 0 when unknown
    # True when the broker stamped `timestamp` when it appended the record (the topic's
    # message.timestamp.type is LogAppendTime), not the producer: a time no writer chose.
    append_time: bool = False
    # The record's headers as the consumer gave them (None: it had none). Only the trace
    # context is read from them, and only with tracing on (`torpor.streams.tracing`):
    # headers are not part of the input, so they change no fold and no replay.
    headers: tuple[tuple[str, str | bytes | None], ...] | None = None


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """A record to produce inside the open transaction.

    `partition=None` leaves the choice to the producer's murmur2 partitioner (keyed by
    `key`); loopback inputs and anything that must land on a known partition set it.
    """

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class TaskOutput:
    """What processing a batch produced: records for other topics and store changes.

    `changes` are the overlay writes made by the batch, in order; the loop writes each
    as a changelog record to the input's partition number, keyed and valued exactly like
    the store row (so the compacted changelog *is* the store).
    """

    records: tuple[OutputRecord, ...] = ()
    changes: tuple[Change, ...] = ()


@dataclass(frozen=True, slots=True)
class StoredOffsets:
    """How far a partition's store has got.

    `changelog_offset`: the offset of the last changelog record the store holds (None:
    none yet, restore from the start). `input_offset`: the next `inputs` offset to fold,
    equal to the group's committed offset when the store is in step (None: never folded).
    """

    changelog_offset: int | None = None
    input_offset: int | None = None


class PartitionTask(Protocol):
    """One `inputs` partition's state and logic, driven by the loop one checkpoint at a time."""

    def offsets(self) -> StoredOffsets:
        """The offsets the store recorded with its last committed write."""
        ...

    def restore(self, changes: Sequence[Change], offsets: StoredOffsets) -> None:
        """Write changelog `changes` straight to the store, with `offsets`, in one batch."""
        ...

    def start(self) -> None:
        """The store is restored and checked: folding begins (resume work left in flight)."""
        ...

    def process(self, records: Sequence[InputRecord]) -> TaskOutput:
        """Fold `records` (in offset order) into the open overlay; return what to produce."""
        ...

    def commit(self, offsets: StoredOffsets) -> None:
        """The transaction committed: write the overlay and `offsets` to the store, one batch.

        Also the moment for work that must follow the commit (the model stage's requests).
        """
        ...

    def abort(self) -> None:
        """The transaction was aborted: drop the overlay and whatever it was going to cause."""
        ...

    def wipe(self) -> None:
        """Delete every row and offset of the store, so restore rebuilds it from offset 0."""
        ...

    def close(self) -> None:
        """Close the store. The task is not used again."""
        ...


class TaskFactory(Protocol):
    """Opens the task of one partition when the group assigns it."""

    def __call__(self, partition: int) -> PartitionTask: ...


# An `InputRecord` per consumed record and some 16 `OutputRecord`s per completion:
# `object.__setattr__` per field cost 0.58 us a record, slot stores 0.36 (`schemas/frozen.py`).
fast_inits(__name__)
