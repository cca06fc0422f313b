"""The log seam: append records to a topic's partitions, read them back from an offset.

`Log` is what local mode runs on instead of a broker, and what the Kafka mode's topics
look like from the shell's side: a topic has a fixed number of partitions; a record is
appended keyed (its partition chosen by the Java-compatible murmur2 partitioner, so a
thread lands where any producer would put it) or to an explicit partition (loopback and
changelog records); each partition's records are numbered by offset from 0, in append
order, and never change.

Topics are typed (`LogTopic[V]`), and keys are text or bytes (changelog keys are store
keys). The in-process log holds the record values themselves, so local mode pays no
serialisation and a reader gets back exactly what was appended. Kafka mode serialises
at its boundary with `torpor.schemas`' codec.

`InProcessLog` is the real in-memory twin, shipped for local mode and tests. It has no
transactions: local mode appends a step's outputs only after applying the step, which
is what "visible after the commit" means there.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from torpor.schemas.frozen import fast_inits
from torpor.streams.partitioner import partition_for

V = TypeVar("V")
V_co = TypeVar("V_co", covariant=True)


@dataclass(frozen=True)  # no slots: `LogTopic[Input](...)` sets `__orig_class__` on the instance
class LogTopic(Generic[V]):
    """A topic's name and partition count; `V`, the value type, is for the checker:
    `LogTopic[Input]("torpor.inputs", 4)`."""

    name: str
    partitions: int

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"topic {self.name!r} needs at least one partition, not {self.partitions}")


@dataclass(frozen=True, slots=True)
class LogRecord(Generic[V_co]):
    """One record as stored: where it is, its key and its value (covariant: read-only)."""

    topic: str
    partition: int
    offset: int
    key: str | bytes
    value: V_co


class Log(Protocol):
    """An append-only, partitioned log. Implemented by `InProcessLog` (and Kafka, later)."""

    def append(
        self, topic: LogTopic[V], key: str | bytes, value: V, partition: int | None = None
    ) -> LogRecord[V]:
        """Append `value` keyed by `key`, to `partition` or the key's partition; return it placed."""
        ...

    def append_all(
        self, topic: LogTopic[V], items: Sequence[tuple[str | bytes, V]]
    ) -> Sequence[LogRecord[V]]:
        """Append each `(key, value)` of `items` in order, each to its key's partition, as
        `append` would one by one; return them placed, in that order."""
        ...

    def read(
        self, topic: LogTopic[V], partition: int, offset: int, max_records: int | None = None
    ) -> Sequence[LogRecord[V]]:
        """Records of `partition` from `offset` on (at most `max_records`), in offset order."""
        ...

    def end_offset(self, topic: LogTopic[V], partition: int) -> int:
        """The offset the next appended record of `partition` will get."""
        ...


def partition_of(topic: LogTopic[V], key: str | bytes) -> int:
    """The partition a keyed record of `topic` goes to: murmur2, as every producer computes it."""
    if topic.partitions == 1:  # any hash modulo 1: local mode's default, a dozen appends per input
        return 0
    return partition_for(key.encode("utf-8") if isinstance(key, str) else key, topic.partitions)


class InProcessLog:
    """A `Log` in memory: lists per topic partition, safe to share between threads.

    `trim()` drops every record held, as Kafka's retention would once they are read: the
    offsets go on counting, and a read from a dropped offset raises `ValueError`. Local
    mode never trims (its log is its transcript); a long benchmark does between waves, so
    that what it measures is the runtime's own memory, not the broker's it stands in for.
    """

    def __init__(self) -> None:
        self._partitions: dict[tuple[str, int], list[LogRecord[object]]] = {}
        self._first: dict[tuple[str, int], int] = {}  # the offset of a partition's first record held
        self._shapes: dict[str, int] = {}
        self._lock = threading.Lock()

    def _records(self, topic: LogTopic[V], partition: int) -> list[LogRecord[object]]:
        known = self._shapes.setdefault(topic.name, topic.partitions)
        if known != topic.partitions:
            raise ValueError(f"topic {topic.name!r} has {known} partitions, not {topic.partitions}")
        if not 0 <= partition < topic.partitions:
            raise ValueError(f"topic {topic.name!r} has no partition {partition}")
        return self._partitions.setdefault((topic.name, partition), [])

    def append(
        self, topic: LogTopic[V], key: str | bytes, value: V, partition: int | None = None
    ) -> LogRecord[V]:
        target = partition_of(topic, key) if partition is None else partition
        with self._lock:
            records = self._records(topic, target)
            offset = self._first.get((topic.name, target), 0) + len(records)
            record = LogRecord(topic.name, target, offset, key, value)
            records.append(record)  # held as object (covariant), read back as V
        return record

    def append_all(
        self, topic: LogTopic[V], items: Sequence[tuple[str | bytes, V]]
    ) -> Sequence[LogRecord[V]]:
        # One lock and one look-up of a partition's list for a checkpoint's records of a topic,
        # not one per record: local mode appends ~6 a completion this way (~1.6 us each alone).
        if topic.partitions > 1:
            return [self.append(topic, key, value) for key, value in items]
        name = topic.name
        with self._lock:
            records = self._records(topic, 0)
            start = self._first.get((name, 0), 0) + len(records)
            placed = [LogRecord(name, 0, start + i, key, value) for i, (key, value) in enumerate(items)]
            records.extend(placed)
        return placed

    def read(
        self, topic: LogTopic[V], partition: int, offset: int, max_records: int | None = None
    ) -> Sequence[LogRecord[V]]:
        with self._lock:
            records = self._records(topic, partition)
            first = self._first.get((topic.name, partition), 0)
            if offset < first:
                raise ValueError(f"{topic.name}[{partition}] offset {offset} was trimmed (from {first} on)")
            start = offset - first
            end = len(records) if max_records is None else min(len(records), start + max_records)
            return tuple(records[start:end])  # type: ignore[arg-type]

    def end_offset(self, topic: LogTopic[V], partition: int) -> int:
        with self._lock:
            return self._first.get((topic.name, partition), 0) + len(self._records(topic, partition))

    def read_all(self, topic: LogTopic[V]) -> Sequence[LogRecord[V]]:
        """Every record of `topic` held, partition by partition (for transcripts and tests)."""
        out: list[LogRecord[V]] = []
        for partition in range(topic.partitions):
            out.extend(self.read(topic, partition, self._first.get((topic.name, partition), 0)))
        return tuple(out)

    def trim(self) -> int:
        """Drop every record held (the offsets go on counting); return how many were dropped."""
        with self._lock:
            dropped = 0
            for where, records in self._partitions.items():
                self._first[where] = self._first.get(where, 0) + len(records)
                dropped += len(records)
                records.clear()
            return dropped


# A record is built per append (several per input in local mode): a faster __init__, same
# signature (torpor.schemas.frozen).
fast_inits(__name__)
