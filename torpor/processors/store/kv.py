"""The processor's store seam: a `Store` Protocol, its two real twins, and the `Overlay`.

A store is one partition's table of rows (layout in `keys.py`): byte keys, byte values,
scanned in key order. It is a cache of the changelog that may lag the committed
transaction but never lead it (DESIGN section 6), which is why the fold's writes go to an
`Overlay` first and reach the store only through `Store.apply`, after the commit:

    step(overlay, records)        reads see the overlay's pending writes over the store
    ... produce, commit ...
    overlay.commit(offsets)       store.apply(changes, offsets): one atomic write batch
    (or overlay.abort())          the writes are dropped; the store never saw them

Implementations:
- `MemoryStore`: a dict with a sorted key index. Local mode and tests; shipped, not a mock.
- `RocksStore`: RocksDB through rocksdict, raw byte keys, one block cache shared by every
  store of the process (so N partitions do not cost N caches), WAL on, and `apply` as one
  `WriteBatch` carrying the rows and the offsets the batch reaches. The rows it wrote last
  are also kept in a bounded `RowCache` in front of RocksDB, for the reads that follow.

Both record `StoreOffsets` (the changelog offset and the input offset the store has
reached) in metadata rows written in the same batch as the rows they describe, so a
restart knows exactly where to resume restoring. `tests/processors/test_store.py` runs
one contract against both.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol, cast

from mypy_extensions import mypyc_attr
from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBatch, WriteBufferManager, WriteOptions

from torpor.processors.store import keys

Change = tuple[bytes, bytes | None]
"""One write: the key and its new value, or None for a delete (a changelog tombstone)."""


@dataclass(frozen=True, slots=True)
class StoreOffsets:
    """How far a store has got: the last changelog offset and next input offset it holds."""

    changelog_offset: int | None = None
    input_offset: int | None = None


class Store(Protocol):
    """One partition's rows. Implemented by `MemoryStore`, `RocksStore` and `Overlay`."""

    def get(self, key: bytes) -> bytes | None:
        """The value at `key`, or None when there is no row."""
        ...

    def put(self, key: bytes, value: bytes) -> None:
        """Write one row (an `Overlay` stages it; a store writes it at once)."""
        ...

    def delete(self, key: bytes) -> None:
        """Delete one row, if there is one."""
        ...

    def iterate(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Rows whose key starts with `prefix`, in key order, from `start` (a full key) on."""
        ...

    def apply(self, changes: Sequence[Change], offsets: StoreOffsets | None = None) -> None:
        """Write `changes` (and `offsets`, when given) atomically: all of them or none."""
        ...

    def offsets(self) -> StoreOffsets:
        """The offsets recorded by the last `apply` that carried them."""
        ...


def _encode_offsets(offsets: StoreOffsets) -> list[Change]:
    rows: list[Change] = []
    if offsets.changelog_offset is not None:
        rows.append((keys.meta_key(keys.META_CHANGELOG_OFFSET), keys.encode_seq(offsets.changelog_offset)))
    if offsets.input_offset is not None:
        rows.append((keys.meta_key(keys.META_INPUT_OFFSET), keys.encode_seq(offsets.input_offset)))
    return rows


def _decode_offsets(store: Store) -> StoreOffsets:
    changelog = store.get(keys.meta_key(keys.META_CHANGELOG_OFFSET))
    inputs = store.get(keys.meta_key(keys.META_INPUT_OFFSET))
    return StoreOffsets(
        changelog_offset=None if changelog is None else keys.decode_seq(changelog),
        input_offset=None if inputs is None else keys.decode_seq(inputs),
    )


# Tests subclass it (a store torn by a concurrent commit, one that counts what is read): a
# compiled class (torpor.native) allows that only when told.
@mypyc_attr(allow_interpreted_subclasses=True)
class MemoryStore:
    """A dict-backed `Store`: the same contract as RocksDB, gone when the process ends."""

    def __init__(self) -> None:
        self._rows: dict[bytes, bytes] = {}
        self._sorted: list[bytes] = []  # the keys in order, for prefix scans

    def get(self, key: bytes) -> bytes | None:
        return self._rows.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.apply(((key, value),))

    def delete(self, key: bytes) -> None:
        self.apply(((key, None),))

    def iterate(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        begin = prefix if start is None or start < prefix else start
        # Snapshot the keys in range, so a caller may write while it iterates.
        index = bisect.bisect_left(self._sorted, begin)
        selected: list[bytes] = []
        while index < len(self._sorted) and self._sorted[index].startswith(prefix):
            selected.append(self._sorted[index])
            index += 1
        for key in selected:
            value = self._rows.get(key)
            if value is not None:
                yield key, value

    def apply(self, changes: Sequence[Change], offsets: StoreOffsets | None = None) -> None:
        rows = list(changes) + (_encode_offsets(offsets) if offsets is not None else [])
        for key, value in rows:
            if value is None:
                if self._rows.pop(key, None) is not None:
                    del self._sorted[bisect.bisect_left(self._sorted, key)]
            else:
                if key not in self._rows:
                    bisect.insort(self._sorted, key)
                self._rows[key] = value

    def offsets(self) -> StoreOffsets:
        return _decode_offsets(self)

    def __len__(self) -> int:
        return len(self._rows)


BLOCK_CACHE_BYTES: Final = 64 << 20
"""The one block cache every RocksStore of the process shares (64 MiB: a laptop default)."""

WRITE_BUFFER_BYTES: Final = 32 << 20
"""The memtables of every RocksStore of the process together (one RocksDB write buffer
manager): past this, RocksDB flushes the store being written to. RocksDB's default is two
64 MiB memtables per store, and a store per partition let the process grow by 128 MiB per
partition (~150 KiB of resident memory per agent in a 2,000-agent Kafka run); a bound per
store still grew with the partitions a process owns. Flushed rows are served from the
shared block cache."""

MEMTABLE_BYTES: Final = 8 << 20
"""One memtable of a store (two at most), within `WRITE_BUFFER_BYTES` for all of them."""

ARENA_BLOCK_BYTES: Final = 64 << 10
"""What a memtable allocates at a time, charged to `WRITE_BUFFER_BYTES` as it does."""

MEMTABLE_BLOOM_RATIO: Final = 0.01
"""A memtable's bloom filter over whole keys, as a fraction of the memtable (82 KiB of
bits for an 8 MiB memtable of ~14,000 rows: far more than the ~10 bits a key a 1% false
positive rate needs). Most point reads that reach RocksDB miss the memtables (a message
id never seen: two per local completion; a row flushed long ago), and each miss walked
both memtables' skip lists: ~1.1 us, ~0.3 with the filter (a rocksdict micro-benchmark).
It lives in the memtable's arena, so the write buffer manager counts it; kept small
because every open store's active memtable holds one from its first write."""

L0_COMPACTION_TRIGGER: Final = 8
"""How many flushed files (level 0) a store gathers before RocksDB merges them into level 1
(its default: 4). A thread's state row is written again at every input and keys spread
over the whole key range, so each merge rewrites most of level 1; merging twice as many
files at a time halves that rewriting. At 10,000 agents x 20 turns in local mode the
background threads' CPU fell from ~21% of the process's to ~15% (bench/README.md,
"stop 32"); reads check a few more level-0 files' bloom filters. Well below RocksDB's
slowdown trigger (20 files)."""

_shared_cache: Cache | None = None
_shared_buffers: WriteBufferManager | None = None


def _block_cache() -> Cache:
    # Created lazily, once: RocksDB requires the cache to outlive every DB using it, and
    # a module-level object lives as long as the process.
    global _shared_cache
    if _shared_cache is None:
        _shared_cache = Cache(_bounds.block_cache_bytes)
    return _shared_cache


def _write_buffers() -> WriteBufferManager:
    # Like the block cache: once, for the life of the process. No stall: a writer past the
    # bound is not held, RocksDB flushes.
    global _shared_buffers
    if _shared_buffers is None:
        _shared_buffers = WriteBufferManager(_bounds.write_buffer_bytes, False)
    return _shared_buffers


ROW_CACHE_BYTES: Final = 16 << 20
"""What the `RowCache`s of every RocksStore of the process hold together (keys and
values), shared out evenly among the open stores: the rows of the threads that ran last,
which the next input of each thread and the model stage read back."""


@dataclass(frozen=True, slots=True)
class StoreMemory:
    """The bounds every RocksStore of the process opens with (`configure_memory`): each is
    for the whole process, however many stores (partitions) it has open."""

    block_cache_bytes: int = BLOCK_CACHE_BYTES
    row_cache_bytes: int = ROW_CACHE_BYTES
    write_buffer_bytes: int = WRITE_BUFFER_BYTES

    def __post_init__(self) -> None:
        # A write buffer manager of 0 bytes would bound nothing, a block cache of 0 cache
        # nothing: refused, as `MemorySettings` refuses them from the operator.
        if self.block_cache_bytes < 1 or self.write_buffer_bytes < 1 or self.row_cache_bytes < 0:
            raise ValueError(f"store bounds out of range: {self}")


_bounds = StoreMemory()
_shared_rows: weakref.WeakSet[RowCache] = weakref.WeakSet()  # the caches sharing `row_cache_bytes`
_finalizers: weakref.WeakKeyDictionary[RowCache, weakref.finalize[[], RowCache]] = weakref.WeakKeyDictionary()
_sharing = threading.RLock()  # who shares and each share change together


def configure_memory(bounds: StoreMemory) -> None:
    """Set the bounds of the stores this process opens from now on (the command line does,
    from the operator's settings, before any store opens). The block cache and the write
    buffer manager are one each for the process and live as long as it: once made, their
    sizes cannot change."""
    global _bounds
    if _shared_cache is not None and bounds.block_cache_bytes != _bounds.block_cache_bytes:
        raise RuntimeError("the block cache is made already: set the store bounds before any store opens")
    if _shared_buffers is not None and bounds.write_buffer_bytes != _bounds.write_buffer_bytes:
        raise RuntimeError("the write buffers are made already: set the store bounds before any store opens")
    _bounds = bounds
    _share_rows()


def _share_rows() -> None:
    """Give each open store's row cache an even share of the process's `row_cache_bytes`."""
    with _sharing:
        caches = list(_shared_rows)
        for cache in caches:
            cache.resize(_bounds.row_cache_bytes // len(caches))


@dataclass(frozen=True, slots=True)
class CacheUse:
    """What the process's bounded store caches hold now, in bytes (`cache_use`): RocksDB's
    block cache, the memtables its write buffer manager counts, and the row caches (their
    keys and values plus `_ROW_OVERHEAD` a row, as they count against `row_cache_bytes`)."""

    block_cache: int
    memtables: int
    rows: int


def cache_use() -> CacheUse:
    """What the caches behind `StoreMemory`'s bounds hold now, for the process's stores
    together. Safe on any thread (a metrics scrape): RocksDB reads its counters under its
    own locks (no Python runs under them), and a row cache's count is an int read under
    the GIL. Each is bounded by its share of `[memory]` (the block cache loosely: it is
    not strict-capacity); the block cache and the row caches fill up to theirs and stay
    there, the memtables fall back at each flush. Resident memory that grows past them
    is what grows with the agents."""
    with _sharing:
        rows = sum(cache.held_bytes for cache in _shared_rows)
    block = 0 if _shared_cache is None else _shared_cache.get_usage()
    memtables = 0 if _shared_buffers is None else _shared_buffers.get_usage()
    return CacheUse(block, memtables, rows)


def _join_rows(cache: RowCache) -> None:
    """`cache` shares the process's budget from now on, until `_leave_rows` or until it is
    dropped (a store never closed): either way the others get its share back."""
    with _sharing:
        _shared_rows.add(cache)
        _share_rows()
        # Kept, so that `_leave_rows` detaches it: a closed store's cache then re-shares
        # nothing when it is collected (a collection can run inside another cache's
        # `remember`, whose lock `_share_rows` would wait for on the same thread).
        _finalizers[cache] = weakref.finalize(cache, _share_rows)


def _leave_rows(cache: RowCache) -> None:
    with _sharing:
        finalizer = _finalizers.pop(cache, None)
        if finalizer is not None:
            finalizer.detach()
        if cache in _shared_rows:
            _shared_rows.discard(cache)
            cache.resize(0)  # a closed store answers no read from memory, and holds none
            _share_rows()


_ROW_OVERHEAD: Final = 64  # bytes a cached row costs beyond its key and value (dict slot, objects)


# A Python class even when this module is compiled (torpor.native): the caches sharing the
# row budget are held weakly (`_shared_rows`), and a compiled class takes no weak reference.
@mypyc_attr(native_class=False)
class RowCache:
    """The rows one store wrote (or found) last, by key (None: deleted), oldest evicted first.

    Why: each input reads back rows the step wrote a checkpoint earlier (the thread's
    state, its awaiting-model index row) and the model stage reads the state and the
    history rows just appended; served from RocksDB, each read was a call into RocksDB
    (the memtable, the bloom filters, the block cache) costing more than the fold's work
    on it. Kept in the order rows came in, not refreshed by a read that finds one: a
    thread's rows are rewritten at each input, so the oldest write is the coldest row.

    `remember` (called by the store's one writer, after its batch is written) fills it, and
    so does `admit`: a row a read found in RocksDB, kept as the newest. Why admit reads: a
    row written once and read at every input (a thread's config row) left the cache as the
    writes went on, and was then read from RocksDB (the index, a data block) at every
    input, ~0.5 such reads per local completion (4-5% of local mode's CPU, bench/README.md,
    stop 34). A reader may run on another thread than the writer (the model stage in Kafka
    mode), so a read must not put back a value older than a write that overtook it: the
    writer counts its writes at both ends (`writing` before RocksDB is written, `remember`
    after), and `admit` keeps the row only if the count is still the one read before the
    read began: a read that a write began during is not kept, and a row kept while a write
    was under way is then replaced by that write's `remember`. A reader sees either the
    value before a batch or after it, as it would reading RocksDB: reads are dict
    operations, each atomic under the GIL. `admit`, `remember` and `resize` (a store of the
    process opened or closed: the caches share one budget, from any thread) take a lock.
    Bounded by bytes, not by threads: a fixed cost per process.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self._capacity = _checked_capacity(capacity_bytes)
        self.rows: dict[bytes, bytes | None] = {}
        """The rows held, by key (None: deleted), oldest first: a reader looks a key up here
        (`RocksStore.get`; a miss is `_UNKNOWN`). The same dict for the cache's life, read
        only outside this class (changed by the methods below, under the lock)."""
        self._bytes = 0
        self._changing = threading.Lock()  # `remember` on the writer, `admit` and `resize` on any thread
        self.writes = 0
        """Counts each write at its start (`writing`) and at its end (`remember`): read it before
        a read of the store, and pass it to `admit`."""

    def writing(self) -> None:
        """The writer is about to write the store: a read begun before must not be admitted."""
        with self._changing:
            self.writes += 1

    def admit(self, key: bytes, value: bytes, writes: int) -> None:
        """Keep `value`, which a read of `key` found in the store, as the newest row, if no
        write began since the count was `writes` (read before the read began)."""
        with self._changing:
            if self.writes != writes or self._capacity == 0 or key in self.rows:
                return
            self.rows[key] = value
            self._bytes = self._evict(self._bytes + len(key) + _ROW_OVERHEAD + len(value))

    def remember(self, changes: Sequence[Change]) -> None:
        """Record `changes`, just written to the store, as the newest rows."""
        with self._changing:
            self.writes += 1
            if self._capacity == 0:
                return
            rows, pop, held = self.rows, self.rows.pop, self._bytes
            for key, value in changes:  # `_row_bytes` written out: a call per row cost a third of this
                old = pop(key, _UNKNOWN)
                if old is _UNKNOWN:
                    held += len(key) + _ROW_OVERHEAD
                elif old is not None:
                    held -= len(old)  # type: ignore[arg-type]
                rows[key] = value  # re-inserted last: evicted last
                if value is not None:
                    held += len(value)
            self._bytes = self._evict(held)

    def resize(self, capacity_bytes: int) -> None:
        """Hold at most `capacity_bytes` from now on, the oldest rows evicted at once."""
        capacity_bytes = _checked_capacity(capacity_bytes)
        with self._changing:
            self._capacity = capacity_bytes
            self._bytes = self._evict(self._bytes)

    def _evict(self, held: int) -> int:
        """Drop the oldest rows until `held` fits; the bytes still held.

        One pass over the dict's order, then the deletes. Why not `next(iter(rows))` per
        row: a dict keeps the slots of popped keys until it resizes, and iteration starts
        by scanning past them, so popping the oldest row again and again was quadratic
        (9 us a row under load, and a full `resize(0)` at close took 0.6 s)."""
        rows = self.rows
        doomed: list[bytes] = []
        for key, value in rows.items():
            if held <= self._capacity:
                break
            held -= _row_bytes(key, value)
            doomed.append(key)
        for key in doomed:
            del rows[key]
        return held

    @property
    def held_bytes(self) -> int:
        """What the held rows count against the capacity."""
        return self._bytes

    def __len__(self) -> int:
        return len(self.rows)


_UNKNOWN: Final = object()


def _checked_capacity(capacity_bytes: int) -> int:
    if capacity_bytes < 0:
        raise ValueError(f"a row cache needs capacity_bytes >= 0, not {capacity_bytes}")
    return capacity_bytes


def _row_bytes(key: bytes, value: bytes | None) -> int:
    return len(key) + (0 if value is None else len(value)) + _ROW_OVERHEAD


class RocksStore:
    """A `Store` in a RocksDB directory (one per partition), through rocksdict in raw mode.

    The write-ahead log stays on, so an `apply` that returned survives a process crash;
    `sync` (default off) also survives a machine crash, at a cost per batch. Losing the
    last batches to a machine crash is safe: the store may lag the changelog, and
    restore replays the changelog from the offsets recorded here.

    `wal=False` is for a store nobody opens again (local mode's temp directory, removed on
    close): a crash loses the directory with the process, so the log would protect nothing,
    and writing it cost each batch a checksum and a write (~2% of local mode's CPU,
    bench/README.md, stop 34). `sync` needs the log.
    """

    def __init__(
        self, path: Path | str, *, sync: bool = False, row_cache_bytes: int | None = None, wal: bool = True
    ) -> None:
        if sync and not wal:
            raise ValueError("sync=True needs the write-ahead log (wal=True)")
        self.path = Path(path)
        self._recent = RowCache(0 if row_cache_bytes is None else row_cache_bytes)
        self._cached: dict[bytes, bytes | None] = self._recent.rows
        # Histories are private: only the processor's own user may read the store (0700,
        # tightened if an older run made it wider).
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path.chmod(0o700)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        table = BlockBasedOptions()
        table.set_block_cache(_block_cache())
        # Most point reads miss (a message id never seen, a thread without a summary):
        # a bloom filter answers those without reading every level's blocks.
        table.set_bloom_filter(10, False)
        options.set_block_based_table_factory(table)
        options.set_write_buffer_manager(_write_buffers())
        options.set_write_buffer_size(min(MEMTABLE_BYTES, _bounds.write_buffer_bytes))
        options.set_max_write_buffer_number(2)
        # Each memtable holds at least one arena block against the manager's budget;
        # RocksDB's default block (an eighth of the memtable, 1 MiB) let 32 stores hold
        # twice the budget, each flushing tiny files at every write.
        options.set_arena_block_size(ARENA_BLOCK_BYTES)
        options.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO)
        options.set_memtable_whole_key_filtering(True)  # no prefix extractor: the filter is over whole keys
        options.set_level_zero_file_num_compaction_trigger(L0_COMPACTION_TRIGGER)
        self._db = Rdict(str(self.path), options)
        if row_cache_bytes is None:  # a share of the process's, not a size of its own; once open
            _join_rows(self._recent)
        self._write_options = WriteOptions()
        # The WAL is on unless `wal=False` (WriteOptions' default: disable_wal=False): it is
        # what makes an applied batch survive a process crash. Set through `setattr` because
        # rocksdict's stub declares the property as a method.
        if not wal:
            setattr(self._write_options, "disable_wal", True)  # noqa: B010
        self._write_options.sync = sync

    def get(self, key: bytes) -> bytes | None:
        # The cache's rows read directly, from this store's own reference to them: this is
        # the store's hottest call (several per input), and `RowCache` is a Python class
        # (see there), so a method of it, or even its attribute, costs an interpreted lookup.
        cached = self._cached.get(key, _UNKNOWN)
        if cached is not _UNKNOWN:
            return cast(bytes | None, cached)
        recent = self._recent
        writes = recent.writes
        value = self._db.get(key)
        assert value is None or isinstance(value, bytes)
        if value is not None:  # a miss is not kept: most are ids never seen, then written
            recent.admit(key, value, writes)
        return value

    def put(self, key: bytes, value: bytes) -> None:
        self.apply(((key, value),))

    def delete(self, key: bytes) -> None:
        self.apply(((key, None),))

    def iterate(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        begin = prefix if start is None or start < prefix else start
        for key, value in self._db.items(from_key=begin):
            assert isinstance(key, bytes) and isinstance(value, bytes)  # raw mode: bytes only
            if not key.startswith(prefix):
                return
            yield key, value

    def apply(self, changes: Sequence[Change], offsets: StoreOffsets | None = None) -> None:
        batch = WriteBatch(raw_mode=True)
        rows = list(changes) + (_encode_offsets(offsets) if offsets is not None else [])
        for key, value in rows:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self._recent.writing()  # a read overlapping this write is not admitted (`RowCache`)
        self._db.write(batch, self._write_options)
        self._recent.remember(rows)  # only once written: a failed write leaves it as it was

    def offsets(self) -> StoreOffsets:
        return _decode_offsets(self)

    def close(self) -> None:
        try:
            self._db.close()
        finally:
            _leave_rows(self._recent)


class Overlay:
    """Pending writes over a `Store`: what one checkpoint has folded but not yet committed.

    Reads see the pending writes first. `changes()` lists each written key once, with its
    final value, in the order of its last write: these are also the changelog records.
    `commit` applies them to the store in one batch; `abort` drops them.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pending: dict[bytes, bytes | None] = {}

    def get(self, key: bytes) -> bytes | None:
        if key in self._pending:
            return self._pending[key]
        return self.store.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._pending.pop(key, None)  # re-insert: the order is that of the last write
        self._pending[key] = value

    def delete(self, key: bytes) -> None:
        self._pending.pop(key, None)
        self._pending[key] = None

    def iterate(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        begin = prefix if start is None or start < prefix else start
        mine = sorted(k for k in self._pending if k.startswith(prefix) and k >= begin)
        theirs = self.store.iterate(prefix, begin)
        pending_key = 0
        for key, value in theirs:
            while pending_key < len(mine) and mine[pending_key] < key:
                yield from self._pending_row(mine[pending_key])
                pending_key += 1
            if pending_key < len(mine) and mine[pending_key] == key:
                yield from self._pending_row(key)
                pending_key += 1
            else:
                yield key, value
        for key in mine[pending_key:]:
            yield from self._pending_row(key)

    def _pending_row(self, key: bytes) -> Iterator[tuple[bytes, bytes]]:
        value = self._pending.get(key)
        if value is not None:
            yield key, value

    def apply(self, changes: Sequence[Change], offsets: StoreOffsets | None = None) -> None:
        """Stage `changes` in the overlay (an overlay over an overlay nests a checkpoint)."""
        for key, value in changes:
            if value is None:
                self.delete(key)
            else:
                self.put(key, value)

    def offsets(self) -> StoreOffsets:
        return self.store.offsets()

    def changes(self) -> tuple[Change, ...]:
        return tuple(self._pending.items())

    def commit(self, offsets: StoreOffsets | None = None) -> tuple[Change, ...]:
        """Apply the pending writes (and `offsets`) to the store in one batch; return them."""
        changes = self.changes()
        below = self.store
        if type(below) is Overlay and offsets is None:
            # One input's overlay into its checkpoint's (`step`, per input): the same staging
            # as `Overlay.apply`, without a call per row.
            pending = below._pending
            for key, value in changes:
                pending.pop(key, None)  # re-insert: the order is that of the last write
                pending[key] = value
        else:
            below.apply(changes, offsets)
        self._pending.clear()
        return changes

    def abort(self) -> None:
        """Drop the pending writes: the store is as it was before the checkpoint began."""
        self._pending.clear()

    def __len__(self) -> int:
        return len(self._pending)
