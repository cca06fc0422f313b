"""The observer API: a thread's committed history as a snapshot, then every later event once.

Contract. `Observer(settings).snapshot(thread_id)` reads the thread's partition of the
`events` topic, read_committed, from the first retained record to the end of what is
committed now, and returns a `Snapshot`: the committed history entries the events carry,
the committed events, the live text of a completion still streaming (`partial`), and the
`Position` it reached. `Observer.follow(position)` yields every record after that
position exactly once, in offset order per partition, so a snapshot plus what follows
it is the whole stream with no gap and no repeat: the snapshot and the follow are one
pass over the same log, cut at a position. A `Position` is plain data (`as_json`,
`from_json`) so a client can store it and resume after a restart.

Why the events topic and not the store: observers run anywhere, in any language, with
read access to Kafka and nothing else. The price is retention: `events` keeps a day by
default (`torpor.streams.topics`). A snapshot whose history does not start at entry 0,
or that never saw `thread_created`, says so (`complete` is False, `missing` says why);
`torpor history` and `torpor replay` rebuild older threads from the store or the inputs.

Records that do not decode are yielded as `Undecodable` with the reason, never dropped
silently and never fatal: one bad producer must not blind every observer.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from torpor.schemas.codec import Codec
from torpor.schemas.errors import ConfigError, ContractError
from torpor.schemas.records import HistoryEntry, Receipt, ThreadEvent
from torpor.streams.config import Settings, consumer_config
from torpor.streams.deadline import Deadline
from torpor.streams.errors import translate
from torpor.streams.kafkalog import KAFKA_LOG
from torpor.streams.partitioner import partition_for
from torpor.streams.topics import TopicNames

# Kafka's "start from the first retained record" for an explicit assignment.
BEGINNING = -2
END = -1
POLL_SECONDS = 0.2
METADATA_SECONDS = 10.0

# Committed events that reset the live text of a completion (so does the ephemeral
# `completion_retried`: a retry discards the partial turn).
_PARTIAL_RESETS = frozenset({"completion_requested", "turn_committed", "interrupted"})


@dataclass(frozen=True, slots=True)
class Observed:
    """One decoded record of `events` (a `ThreadEvent`) or `receipts` (a `Receipt`)."""

    topic: str
    partition: int
    offset: int
    record: ThreadEvent | Receipt

    @property
    def thread_id(self) -> str:
        return self.record.thread_id


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A record that is not a valid event or receipt: reported, skipped, never fatal."""

    topic: str
    partition: int
    offset: int
    reason: str


Item = Observed | Undecodable


@dataclass(slots=True)
class Position:
    """The next offset to read, per (topic, partition): where an observer resumes."""

    offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def advance(self, topic: str, partition: int, offset: int) -> None:
        self.offsets[(topic, partition)] = offset + 1

    def as_json(self) -> dict[str, int]:
        return {f"{topic}:{partition}": offset for (topic, partition), offset in sorted(self.offsets.items())}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Position:
        """Raises ValueError on a key that is not `topic:partition` or a value that is not an offset."""
        offsets: dict[tuple[str, int], int] = {}
        for key, value in data.items():
            topic, sep, partition = key.rpartition(":")
            # BEGINNING and END stand for a partition not read yet; real offsets are >= 0.
            if (
                not sep
                or not topic
                or not partition.isdigit()
                or not isinstance(value, int)
                or value < BEGINNING
            ):
                raise ValueError(f"not a position entry: {key!r}: {value!r}")
            offsets[(topic, int(partition))] = value
        return cls(offsets)

    def copy(self) -> Position:
        return Position(dict(self.offsets))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A thread's committed history and events, up to `position`."""

    thread_id: str
    entries: tuple[HistoryEntry, ...]
    events: tuple[ThreadEvent, ...]
    partial: str
    position: Position
    undecodable: tuple[Undecodable, ...]
    missing: str | None

    @property
    def complete(self) -> bool:
        """Whether the history starts at entry 0 and the thread's creation was seen."""
        return self.missing is None


class Observer:
    """Reads `events` (and, if asked, `receipts`) with a consumer of its own, no group offsets."""

    def __init__(self, settings: Settings, *, receipts: bool = False, codec: Codec | None = None) -> None:
        self._names = TopicNames.for_prefix(settings.topics.prefix)
        self._codec = codec or Codec.from_url(settings.schema_registry.url)
        self._types: dict[str, type[ThreadEvent] | type[Receipt]] = {self._names.events: ThreadEvent}
        if receipts:
            self._types[self._names.receipts] = Receipt
        conf = consumer_config(settings, f"torpor-observer-{uuid.uuid4().hex}")
        conf["enable.partition.eof"] = True  # how a read learns it reached what is committed now
        self._consumer = Consumer({**conf, "logger": KAFKA_LOG})
        self._partitions: dict[str, int] = {}

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(self._types)

    def partitions(self, topic: str) -> int:
        """How many partitions `topic` has (cached). Raises `ConfigError` if it is not there."""
        if topic not in self._partitions:
            metadata = self._consumer.list_topics(topic, timeout=METADATA_SECONDS).topics.get(topic)
            if metadata is None or metadata.error is not None or not metadata.partitions:
                cause = metadata.error if metadata is not None and metadata.error is not None else None
                detail = f": {translate(cause, operation=f'metadata of {topic}')}" if cause else ""
                raise ConfigError(
                    f"topic {topic} does not exist or has no partitions{detail} "
                    "(is the topic prefix right, and has a processor created the topics?)"
                )
            self._partitions[topic] = len(metadata.partitions)
        return self._partitions[topic]

    def partition_of(self, thread_id: str, topic: str | None = None) -> int:
        topic = topic or self._names.events
        return partition_for(thread_id.encode("utf-8"), self.partitions(topic))

    def start(self, *, at_end: bool, threads: Iterable[str] | None = None) -> Position:
        """Each partition's first retained offset, or (`at_end`) its end now: real offsets, storable.

        Every partition of the observer's topics, or only those `threads` live on.
        """
        wanted = None if threads is None else {(t, self.partition_of(thread, t)) for thread in threads
                                               for t in self._types}
        offsets = {}
        for topic in self._types:
            for partition in range(self.partitions(topic)):
                if wanted is not None and (topic, partition) not in wanted:
                    continue
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=METADATA_SECONDS
                )
                offsets[(topic, partition)] = int(high if at_end else low)
        return Position(offsets)

    def expired(self, position: Position) -> int:
        """How many records `position` still pointed at have since been deleted by retention."""
        lost = 0
        for (topic, partition), offset in position.offsets.items():
            if offset >= 0:
                low, _ = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=METADATA_SECONDS
                )
                lost += max(0, int(low) - offset)
        return lost

    def snapshot(self, thread_id: str, deadline: Deadline | None = None) -> Snapshot:
        """The thread's committed history as of now. Raises `TimeoutError` past `deadline`."""
        deadline = deadline or Deadline.after(60.0)
        topic = self._names.events
        start = Position({(topic, self.partition_of(thread_id)): BEGINNING})
        entries: dict[int, HistoryEntry] = {}
        events: list[ThreadEvent] = []
        bad: list[Undecodable] = []
        partial = ""
        position = start
        for item in self.read(start, until_end=True, deadline=deadline):
            position = item.position
            seen = item.item
            if isinstance(seen, Undecodable):
                bad.append(seen)
                continue
            event = seen.record
            if not isinstance(event, ThreadEvent) or event.thread_id != thread_id:
                continue
            if event.ephemeral:
                partial = "" if event.kind == "completion_retried" else partial + (event.text or "")
                continue
            events.append(event)
            if event.kind in _PARTIAL_RESETS:
                partial = ""
            if event.entry is not None:
                entries[event.entry.seq] = event.entry
        ordered = tuple(entries[seq] for seq in sorted(entries))
        return Snapshot(
            thread_id=thread_id,
            entries=ordered,
            events=tuple(events),
            partial=partial,
            position=position,
            undecodable=tuple(bad),
            missing=_missing(ordered, events),
        )

    def follow(self, position: Position, *, threads: Iterable[str] | None = None,
               deadline: Deadline | None = None) -> Iterator[Item]:
        """Every record after `position`, exactly once, in offset order per partition.

        Without `threads`, every partition is read (those `position` does not name from
        their start). With `threads`, only those threads' partitions, and only their
        records (undecodable records there are always yielded). It runs until the caller
        stops iterating, or raises `TimeoutError` once `deadline` (if any) has passed.
        """
        wanted = set(threads) if threads is not None else None
        start = position.copy()
        if wanted is not None:
            for thread in wanted:
                for topic in self._types:
                    start.offsets.setdefault((topic, self.partition_of(thread, topic)), BEGINNING)
        for step in self.read(start, until_end=False, deadline=deadline, all_partitions=wanted is None):
            item = step.item
            if wanted is None or isinstance(item, Undecodable) or item.thread_id in wanted:
                yield item

    def read(
        self,
        position: Position,
        *,
        until_end: bool,
        deadline: Deadline | None = None,
        all_partitions: bool | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Generator[Step, None, None]:
        """Each record after `position`, with the position just past it.

        Reads every partition of the observer's topics; partitions `position` does not
        name start at the beginning, unless `all_partitions` is False (then only the named
        ones are read; the default is False for `until_end` reads, True otherwise).
        `until_end` stops once each partition read has reached what is committed now;
        `stop` is asked before each poll (a signal handler's flag) and ends the read when true.
        """
        if all_partitions is None:
            all_partitions = not until_end
        current = position.copy()
        assignment = []
        for topic in self._types:
            for partition in range(self.partitions(topic)):
                offset = current.offsets.get((topic, partition))
                if offset is None and not all_partitions:
                    continue
                assignment.append(TopicPartition(topic, partition, BEGINNING if offset is None else offset))
        if not assignment:
            return
        self._consumer.assign(assignment)
        pending = {(tp.topic, tp.partition) for tp in assignment}
        try:
            while not (until_end and not pending) and not (stop is not None and stop()):
                if deadline is not None and deadline.expired():
                    raise TimeoutError(
                        f"the read did not finish within its deadline "
                        f"({len(pending)} partitions still reading)"
                    )
                for message in self._consumer.consume(500, timeout=POLL_SECONDS):
                    topic, partition, offset = (
                        message.topic() or "",
                        message.partition() or 0,
                        message.offset(),
                    )
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            pending.discard((topic, partition))
                            if offset is not None and offset >= 0:
                                current.offsets[(topic, partition)] = offset
                            continue
                        raise translate(error, operation=f"read {topic}")
                    if offset is None:
                        continue
                    item = self._decode(message, topic, partition, offset)
                    current.advance(topic, partition, offset)
                    yield Step(item, current.copy())
        finally:
            # A read abandoned after its observer closed is finalised later: nothing to undo then.
            with contextlib.suppress(RuntimeError, KafkaException):
                self._consumer.unassign()

    def _decode(self, message: Message, topic: str, partition: int, offset: int) -> Item:
        cls = self._types[topic]
        try:
            record = self._codec.decode(
                topic, message.value() or b"", cls, partition=partition, offset=offset
            )
        except ContractError as error:  # a registry that cannot be reached is not the record's fault
            return Undecodable(topic, partition, offset, str(error))
        assert isinstance(record, ThreadEvent | Receipt)
        return Observed(topic, partition, offset, record)

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> Observer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class Step:
    """A record read and the position just past it (what to store to resume after it)."""

    item: Item
    position: Position


def _missing(entries: tuple[HistoryEntry, ...], events: list[ThreadEvent]) -> str | None:
    if not any(e.kind == "thread_created" for e in events):
        return (
            "the thread's creation is not on the events topic (retention removed it, or the thread "
            "does not exist): the snapshot holds only what is retained"
        )
    if entries and entries[0].seq != 0:
        return f"the retained events start at history entry {entries[0].seq}, not 0"
    gaps = [b.seq for a, b in itertools.pairwise(entries) if b.seq != a.seq + 1]
    if gaps:
        return f"history entries are missing before seq {gaps[0]}"
    return None
