"""Replay and history from the log: re-fold `inputs` into scratch stores, compare chain heads.

Contract.

- `read_log(consumer, topic, cut, thread_id)` reads the `inputs` topic read_committed
  from the beginning of every partition up to its end as read_committed sees it (the last
  stable offset at the start of the read), or up to the `Cut`: per partition an offset
  (inclusive) and/or a record time in ms (inclusive). With `thread_id`, only that
  thread's records are returned (a thread's inputs are all keyed by its id).
- `Replayer` folds those records with `torpor.processors.step.step`, the function the
  processor runs, into one `MemoryStore` per partition, with the verifier and the input
  size limit the processor would use (`verifier_for(settings.inputs)`,
  `settings.inputs.max_bytes`): oversized and undecodable records are skipped exactly as
  the processor parks them, without being folded. It produces nothing: loopbacks and
  completions are in `inputs` already, so every output of `step` is dropped.
- `restore_scratch(consumer, changelog, deadline)` reads the compacted changelog
  (read_committed, with `torpor.streams.restore`, the processor's restore code) into a
  `MemoryStore` per partition: the live state without opening the processor's RocksDB.
- `thread_heads(stores)` lists every thread of the stores with its head as its state row
  records it, as the chain over its stored history entries recomputes it, and a digest
  of all its rows; `compare(replayed, live)` reports every thread that differs: missing
  on one side, live rows that do not chain, another head, or (same head) other rows.
- `history_rows(store, thread_id)`: one `HistoryRow` per entry (seq, kind, short
  content, the chain head after it), for `torpor history`.

Nothing here decides anything: the fold decides, this module only feeds it the log.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaException,
    TopicPartition,
)

from torpor.processors.admission import Refused, admit
from torpor.processors.fold.history import advance
from torpor.processors.fold.state import GENESIS_HEAD
from torpor.processors.fold.verify import Verifier
from torpor.processors.restoring import MemoryTarget
from torpor.processors.step import StepRecord, step
from torpor.processors.store import keys
from torpor.processors.store.kv import MemoryStore, RocksStore, Store
from torpor.processors.store.statecodec import WITHOUT_ANSWERED, WITHOUT_CONFIG, decode_state, state_rows
from torpor.processors.store.tables import load_state, read_entries
from torpor.processors.storedirs import partition_dirs, worker_dirs
from torpor.schemas.codec import Codec
from torpor.schemas.errors import ConfigError, RetriableError
from torpor.schemas.records import (
    AssistantEntry,
    EventEntry,
    HistoryEntry,
    Input,
    SummaryEntry,
    TextBlock,
    ThreadConfig,
    ToolResultEntry,
    UserEntry,
)
from torpor.streams.deadline import Deadline
from torpor.streams.errors import translate
from torpor.streams.restore import restore_partitions

# Records folded per `step` call: the processor's checkpoints fold a few hundred at a
# time too; the batch size cannot change the result (state is re-read per input).
STEP_BATCH: Final = 500
_POLL_SECONDS: Final = 0.2
_CONTENT_CHARS: Final = 60


@dataclass(frozen=True, slots=True)
class Cut:
    """Where a replay stops: per-partition last offsets (inclusive), a last record time (ms)."""

    offsets: Mapping[int, int] = field(default_factory=dict)
    until_ms: int | None = None

    @property
    def is_full(self) -> bool:
        return not self.offsets and self.until_ms is None


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record of `inputs`, as read."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    # When the broker appended it, if the topic stamps append times (else None), as the
    # processor reads it: the time the verifier judges at.
    appended_at: int | None = None


Progress = Callable[[int, int], None]
"""Called with (records read so far, records to read at most) while reading."""


def partitions_of(consumer: Consumer, topic: str, timeout: float = 10.0) -> list[int]:
    """The partition ids of `topic`; raises RetriableError if the topic is not there."""
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
    except KafkaException as exc:
        raise translate(exc, operation=f"list_topics({topic})") from exc
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise RetriableError(f"topic {topic} does not exist (or has no partitions): check the topic prefix")
    return sorted(found.partitions)


def read_log(
    consumer: Consumer,
    topic: str,
    cut: Cut = Cut(),
    thread_id: str | None = None,
    *,
    partitions: Sequence[int] | None = None,
    progress: Progress | None = None,
) -> Iterator[LogRecord]:
    """The records of `topic` from the start to its end (or the `cut`), partition by partition order kept."""
    chosen = list(partitions) if partitions is not None else partitions_of(consumer, topic)
    ends: dict[int, int] = {}
    for partition in chosen:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10.0,
                                                       cached=False)
        except KafkaException as exc:
            raise translate(exc, operation=f"get_watermark_offsets({topic}[{partition}])") from exc
        end = int(high)
        if partition in cut.offsets:
            end = min(end, cut.offsets[partition] + 1)
        if end > int(low):
            ends[partition] = end
    total = sum(ends.values())
    if not ends:
        return
    key = thread_id.encode("utf-8") if thread_id is not None else None
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    positions = dict.fromkeys(ends, 0)
    done: set[int] = set()
    seen = 0
    try:
        while len(done) < len(ends):
            for message in consumer.consume(1000, timeout=_POLL_SECONDS):
                error = message.error()
                if error is not None:
                    raise translate(error, operation=f"replay consume {topic}")
                found_partition, found_offset = message.partition(), message.offset()
                assert found_partition is not None and found_offset is not None
                partition, offset = found_partition, found_offset
                if partition in done or offset >= ends[partition]:
                    continue
                positions[partition] = offset + 1
                seen += 1
                kind, stamp = message.timestamp()
                if cut.until_ms is not None and stamp > cut.until_ms:
                    # Record times only grow within a partition (broker or producer time,
                    # give or take a skew): past the cut, the partition is finished.
                    done.add(partition)
                    continue
                if key is not None and message.key() != key:
                    continue
                yield LogRecord(partition, offset, stamp, message.key(), message.value(),
                                max(int(stamp), 0) if kind == TIMESTAMP_LOG_APPEND_TIME else None)
            # Transaction markers and aborted records are never delivered: the position,
            # not the last record, says whether a partition is read to its end.
            for current in consumer.position([TopicPartition(topic, p) for p in ends if p not in done]):
                if current.offset >= 0:
                    positions[current.partition] = max(positions[current.partition], current.offset)
            done.update(p for p, end in ends.items() if positions[p] >= end)
            if progress is not None:
                progress(seen, total)
    finally:
        consumer.unassign()


@dataclass(slots=True)
class ReplayCounts:
    folded: int = 0
    parked: int = 0  # oversized or undecodable: the processor parks them unfolded
    skipped: int = 0  # records of other threads, with a thread filter


class Replayer:
    """Folds log records with `step` into one scratch `MemoryStore` per partition."""

    def __init__(self, verifier: Verifier, codec: Codec, topic: str, max_bytes: int,
                 default_config: ThreadConfig | None = None, partitions: int | None = None) -> None:
        """`partitions`: how many partitions `topic` has, so records off their thread's
        partition are refused as the processor refused them (`step`'s door)."""
        self._verifier = verifier
        self._partitions = partitions
        self._codec = codec
        self._topic = topic
        self._max_bytes = max_bytes
        self._default_config = default_config
        self.stores: dict[int, MemoryStore] = {}
        self.counts = ReplayCounts()
        self._pending: dict[int, list[StepRecord]] = {}

    def feed(self, record: LogRecord) -> None:
        decoded = self._decode(record)
        if decoded is None:
            self.counts.parked += 1
            return
        run = self._pending.setdefault(record.partition, [])
        run.append(StepRecord(decoded, record.partition, record.offset, record.key, record.appended_at))
        if len(run) >= STEP_BATCH:
            self._fold(record.partition)

    def finish(self) -> dict[int, MemoryStore]:
        """Fold what is still batched; return the stores by partition."""
        for partition in list(self._pending):
            self._fold(partition)
        return self.stores

    def _decode(self, record: LogRecord) -> Input | None:
        # The same tests, in the same order, as ThreadTask.process: a record the processor
        # parked unfolded must not be folded here either.
        admitted = admit(self._codec, self._topic, record.value, record.partition, record.offset,
                         self._max_bytes)
        return None if isinstance(admitted, Refused) else admitted

    def _fold(self, partition: int) -> None:
        run = self._pending.pop(partition, [])
        if not run:
            return
        store = self.stores.setdefault(partition, MemoryStore())
        # Outputs are dropped on purpose: the log already holds everything the live
        # processor produced, and a replay must never produce.
        step(store, run, verifier=self._verifier, default_config=self._default_config,
             partitions=self._partitions)
        self.counts.folded += len(run)


def open_stores(store_dir: Path) -> dict[int, RocksStore]:
    """The `partition-N` RocksDB stores of a processor's `--store-dir`, by partition.

    Raises ConfigError when there are none, or when one is open in a running processor
    (RocksDB's lock): stop it first, or read the changelog instead.
    """
    found: dict[int, RocksStore] = {}
    for partition, path in partition_dirs(store_dir).items():
        try:
            found[partition] = RocksStore(path)
        except Exception as exc:  # rocksdict raises a bare Exception for a held lock
            for store in found.values():
                store.close()
            raise ConfigError(f"cannot open the store {path}: {exc}. Is a processor still running on it? "
                              "Stop it, or read the live state from the changelog instead.") from exc
    if not found:
        workers = [path.name for path in worker_dirs(store_dir).values() if partition_dirs(path)]
        if workers:  # `torpor processor` with workers: one directory of stores per worker
            raise ConfigError(f"no partition-N stores under {store_dir}, but a processor's workers' "
                              f"({', '.join(workers)}): give one of them, e.g. {store_dir / workers[0]}")
        raise ConfigError(f"no partition-N stores under {store_dir}: is it a processor's --store-dir?")
    return found


def restore_scratch(consumer: Consumer, changelog: str, deadline: Deadline,
                    partitions: Sequence[int] | None = None) -> dict[int, MemoryStore]:
    """The live stores (of `partitions`, default all) as the compacted changelog holds them."""
    chosen = partitions if partitions is not None else partitions_of(consumer, changelog)
    targets = {p: MemoryTarget() for p in chosen}
    restore_partitions(consumer, changelog, targets, deadline)
    return {p: t.store for p, t in targets.items()}


@dataclass(frozen=True, slots=True)
class ThreadHead:
    """A thread's head as its state row says (`head`) and as its stored entries chain (`chained`)."""

    thread_id: str
    status: str
    history_len: int
    head: str
    entries: int
    chained: str
    # sha256 over every row of the thread (state, history, seen ids, summary pointer), key
    # and value: a replay reproduces all of them byte for byte, not just the chain.
    rows: str = ""

    @property
    def consistent(self) -> bool:
        return self.head == self.chained and self.history_len == self.entries


def _thread_of(key: bytes) -> tuple[str, bytes] | None:
    """The thread a row belongs to and the rest of its key (the kind first), or None for
    a row of no thread (the store-global rows: `keys`)."""
    prefix = keys.thread_prefix_of(key)
    return None if prefix == keys.GLOBAL_PREFIX else (keys.thread_of_prefix(prefix), key[len(prefix):])


def thread_head(store: Store, thread_id: str) -> ThreadHead | None:
    """The thread's recorded and recomputed heads, or None when it has no state row."""
    state = load_state(store, thread_id)
    if state is None:
        return None
    chained, count = GENESIS_HEAD, 0
    for entry in read_entries(store, thread_id):
        chained = advance(chained, entry)
        count += 1
    return ThreadHead(thread_id, str(state.status), state.history_len, state.head, count, chained,
                      _rows_digest(store, thread_id) or "")


def _rows_digest(store: Store, thread_id: str) -> str | None:
    """sha256 over every row of the thread, key and value, in key order (None: it has none).
    A state row of an older form (its config or answered call ids inline) counts as the
    three rows the thread's next input rewrites it to (`state_rows`), so a thread idle since
    the side rows came in still matches."""
    rows = dict(store.iterate(keys.thread_prefix(thread_id)))
    if not rows:
        return None
    state_key = keys.state_key(thread_id)
    state = rows.get(state_key)
    if state is not None and state[:1] != WITHOUT_ANSWERED:
        config_key = keys.config_key(thread_id)
        config = rows.get(config_key) if state[:1] == WITHOUT_CONFIG else None
        rows[state_key], rows[config_key], rows[keys.answered_key(thread_id)] = \
            state_rows(decode_state(state, config, None))
    digest = hashlib.sha256()
    for key in sorted(rows):
        value = rows[key]
        digest.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
    return digest.hexdigest()


def _thread_ids_with_rows(store: Store) -> list[str]:
    """Every thread with a row in `store`, a state row or not (a deleted thread keeps its seen rows)."""
    found: list[str] = []
    for key, _ in store.iterate(b""):
        row = _thread_of(key)
        if row is not None and (not found or found[-1] != row[0]):  # key order: a thread's rows are together
            found.append(row[0])
    return found


def thread_heads(stores: Mapping[int, Store], only: str | None = None) -> dict[str, ThreadHead]:
    """Heads of every thread of `stores` (or of thread `only`), by thread id. A deleted thread
    (rows but no state: its seen rows, which decide whether a copy of its inputs is a
    duplicate) has a head too, status `deleted`, so a replay compares its rows as well."""
    found: dict[str, ThreadHead] = {}
    for store in stores.values():
        for thread_id in [only] if only is not None else _thread_ids_with_rows(store):
            head = thread_head(store, thread_id)
            if head is None and (digest := _rows_digest(store, thread_id)) is not None:
                head = ThreadHead(thread_id, "deleted", 0, GENESIS_HEAD, 0, GENESIS_HEAD, digest)
            if head is not None:
                found[thread_id] = head
    return found


@dataclass(frozen=True, slots=True)
class Mismatch:
    thread_id: str
    reason: str
    replayed: ThreadHead | None
    live: ThreadHead | None


def compare(replayed: Mapping[str, ThreadHead], live: Mapping[str, ThreadHead]) -> list[Mismatch]:
    """Every thread whose live head differs from the replay's, or whose live rows do not chain."""
    found: list[Mismatch] = []
    for thread_id in sorted(set(replayed) | set(live)):
        mine, theirs = replayed.get(thread_id), live.get(thread_id)
        if mine is None:
            found.append(Mismatch(thread_id, "live only: the replay has no such thread", None, theirs))
        elif theirs is None:
            found.append(Mismatch(thread_id, "replay only: the live store has no such thread", mine, None))
        elif not theirs.consistent:
            found.append(Mismatch(thread_id, f"live rows do not chain: state says {theirs.history_len} "
                                  f"entries, head {theirs.head[:12]}; the stored entries ({theirs.entries}) "
                                  f"chain to {theirs.chained[:12]}", mine, theirs))
        elif (mine.head, mine.history_len) != (theirs.head, theirs.history_len):
            found.append(Mismatch(thread_id, f"heads differ: replay {mine.history_len} entries, "
                                  f"{mine.head[:12]}; live {theirs.history_len} entries, {theirs.head[:12]}",
                                  mine, theirs))
        elif mine.rows != theirs.rows:
            found.append(Mismatch(thread_id, "same head, but the thread's rows differ (its state, seen "
                                  "message ids or summary pointer)", mine, theirs))
    return found


@dataclass(frozen=True, slots=True)
class HistoryRow:
    seq: int
    kind: str
    created_at: int
    input_id: str
    content: str
    head: str  # the chain head after this entry

    def line(self) -> str:
        return f"{self.seq:>5}  {self.kind:<11}  {self.head[:12]}  {self.content}"

    def as_json(self) -> dict[str, object]:
        return {"seq": self.seq, "kind": self.kind, "created_at": self.created_at,
                "input_id": self.input_id, "content": self.content, "head": self.head}


def history_rows(store: Store, thread_id: str) -> list[HistoryRow]:
    """One row per stored entry of the thread, with the chain head after it."""
    rows: list[HistoryRow] = []
    head = GENESIS_HEAD
    for entry in read_entries(store, thread_id):
        head = advance(head, entry)
        kind, content = describe(entry)
        rows.append(HistoryRow(entry.seq, kind, entry.created_at, entry.input_id, content, head))
    return rows


def _text(blocks: Sequence[object]) -> str:
    return " ".join(b.text for b in blocks if isinstance(b, TextBlock))


def describe(entry: HistoryEntry) -> tuple[str, str]:
    """(kind, short content) of an entry, for one line of output."""
    body = entry.body
    match body:
        case UserEntry(content=content):
            kind, text = "user", _text(content)
        case AssistantEntry(content=content, tool_calls=calls):
            called = " ".join(f"{c.name}({c.arguments})" for c in calls)
            kind, text = "assistant", " ".join(p for p in (_text(content), called) if p)
        case ToolResultEntry(name=name, ok=ok, content=content):
            kind, text = "tool_result", f"{name} {'ok' if ok else 'error'}: {_text(content)}"
        case EventEntry(kind=what, content=content):
            kind, text = "event", f"{what}: {_text(content)}"
        case SummaryEntry(text=summary, up_to_seq=up_to):
            kind, text = "summary", f"up to {up_to}: {summary}"
    flat = json.dumps(text, ensure_ascii=False)[1:-1]  # one line, whatever the text holds
    return kind, flat if len(flat) <= _CONTENT_CHARS else flat[: _CONTENT_CHARS - 1] + "…"


class RateMeter:
    """Records per second for a progress line."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start = clock()

    def rate(self, count: int) -> float:
        elapsed = self._clock() - self._start
        return count / elapsed if elapsed > 0 else 0.0

    @property
    def elapsed(self) -> float:
        return self._clock() - self._start
