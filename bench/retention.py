"""`RetainedLog`: the in-process log with Kafka-like retention, for long local runs.

Contract. The same methods as `torpor.streams.log.InProcessLog` (append, read,
end_offset, read_all), offsets never reused; `trim()` drops every record already
appended, keeping the offsets counting. Local mode keeps its whole log in memory
because the log stands in for Kafka, which lives outside the processor; a benchmark
of idle memory trims it between waves (after `run_until_idle`, when every record has
been read), so that what is measured is the runtime's own memory, not the broker's.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TypeVar

from torpor.streams.log import LogRecord, LogTopic, partition_of

V = TypeVar("V")


class RetainedLog:
    def __init__(self) -> None:
        self._parts: dict[tuple[str, int], list[LogRecord[object]]] = {}
        self._base: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def append(
        self, topic: LogTopic[V], key: str | bytes, value: V, partition: int | None = None
    ) -> LogRecord[V]:
        target = partition_of(topic, key) if partition is None else partition
        if not 0 <= target < topic.partitions:
            raise ValueError(f"topic {topic.name!r} has no partition {target}")
        where = (topic.name, target)
        with self._lock:
            records = self._parts.setdefault(where, [])
            record = LogRecord(topic.name, target, self._base.get(where, 0) + len(records), key, value)
            records.append(record)
        return record

    def append_all(
        self, topic: LogTopic[V], items: Sequence[tuple[str | bytes, V]]
    ) -> Sequence[LogRecord[V]]:
        # As `InProcessLog.append_all`: one lock and one look-up of the partition's list per
        # call when the topic has one partition (local mode's), else per record.
        name, placed = topic.name, []
        with self._lock:
            if topic.partitions == 1:
                records = self._parts.setdefault((name, 0), [])
                start = self._base.get((name, 0), 0) + len(records)
                placed = [LogRecord(name, 0, start + i, key, value) for i, (key, value) in enumerate(items)]
                records.extend(placed)  # held as object, read back as V
            else:
                for key, value in items:
                    target = partition_of(topic, key)
                    where = (name, target)
                    records = self._parts.setdefault(where, [])
                    record = LogRecord(name, target, self._base.get(where, 0) + len(records), key, value)
                    records.append(record)
                    placed.append(record)
        return placed

    def read(
        self, topic: LogTopic[V], partition: int, offset: int, max_records: int | None = None
    ) -> Sequence[LogRecord[V]]:
        where = (topic.name, partition)
        with self._lock:
            base = self._base.get(where, 0)
            if offset < base:
                raise ValueError(f"{topic.name}[{partition}] offset {offset} was trimmed (starts at {base})")
            records = self._parts.get(where, [])
            start = offset - base
            end = len(records) if max_records is None else min(len(records), start + max_records)
            return tuple(records[start:end])  # type: ignore[arg-type]

    def end_offset(self, topic: LogTopic[V], partition: int) -> int:
        where = (topic.name, partition)
        with self._lock:
            return self._base.get(where, 0) + len(self._parts.get(where, []))

    def read_all(self, topic: LogTopic[V]) -> Sequence[LogRecord[V]]:
        out: list[LogRecord[V]] = []
        for partition in range(topic.partitions):
            out.extend(self.read(topic, partition, self._base.get((topic.name, partition), 0)))
        return tuple(out)

    def trim(self) -> int:
        """Drop every record held; returns how many were dropped."""
        with self._lock:
            dropped = 0
            for where, records in self._parts.items():
                self._base[where] = self._base.get(where, 0) + len(records)
                dropped += len(records)
                records.clear()
            return dropped
