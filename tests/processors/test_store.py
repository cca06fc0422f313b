"""One contract for every `Store`: MemoryStore, RocksStore (with its default row cache, one
that evicts at once, and none), and an Overlay over each."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torpor.processors.fold.history import chain
from torpor.processors.fold.state import GENESIS_HEAD
from torpor.processors.store import keys, kv
from torpor.processors.store.kv import Change, MemoryStore, Overlay, RocksStore, RowCache, Store, StoreOffsets
from torpor.processors.store.statecodec import encode_entry
from torpor.processors.store.tables import POINT_READS_UP_TO, _read_chained, thread_states
from torpor.schemas.records import HistoryEntry, TextBlock, UserEntry

StoreFactory = Callable[[], Store]


# Row cache sizes: the default, one that holds about one row (evicts at every write), none.
ROW_CACHES = {"rocks": None, "rocks-tiny-cache": 100, "rocks-no-cache": 0}


@pytest.fixture(params=["memory", *ROW_CACHES, "overlay-memory", "overlay-rocks"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    opened: list[RocksStore] = []

    def make() -> Store:
        kind: str = request.param
        base: Store
        if "rocks" in kind:
            cache = ROW_CACHES.get(kind.removeprefix("overlay-"))
            path = tmp_path / f"db{len(opened)}"
            rocks = RocksStore(path) if cache is None else RocksStore(path, row_cache_bytes=cache)
            opened.append(rocks)
            base = rocks
        else:
            base = MemoryStore()
        return Overlay(base) if kind.startswith("overlay") else base

    yield make
    for rocks in opened:
        rocks.close()


def test_get_put_delete(store_factory: StoreFactory) -> None:
    store = store_factory()
    assert store.get(b"k") is None
    store.put(b"k", b"v")
    assert store.get(b"k") == b"v"
    store.put(b"k", b"w")
    assert store.get(b"k") == b"w"
    store.delete(b"k")
    assert store.get(b"k") is None
    store.delete(b"never-there")


def test_prefix_scan_is_ordered_and_bounded(store_factory: StoreFactory) -> None:
    store = store_factory()
    for seq in (3, 0, 256, 1):
        store.put(keys.history_key("t1", seq), str(seq).encode())
    store.put(keys.history_key("t10", 0), b"other thread")
    store.put(keys.state_key("t1"), b"state")
    rows = list(store.iterate(keys.history_prefix("t1")))
    assert [keys.seq_of_history_key(k) for k, _ in rows] == [0, 1, 3, 256]
    start = keys.history_key("t1", 2)
    assert [v for _, v in store.iterate(keys.history_prefix("t1"), start)] == [b"3", b"256"]


def test_thread_t1_never_sees_rows_of_t10(store_factory: StoreFactory) -> None:
    store = store_factory()
    store.put(keys.seen_key("t10", "m"), b"")
    store.put(keys.state_key("t10"), b"s")
    assert list(store.iterate(keys.thread_prefix("t1"))) == []
    assert len(list(store.iterate(keys.thread_prefix("t10")))) == 2


# A thread's rows: any of its kinds, the state row or not (a deleted thread keeps its seen
# rows), with ids of any length and any characters (their UTF-8 may end in bytes a
# successor key must carry over).
_THREAD_ROWS = st.dictionaries(
    st.text(min_size=1, max_size=6),
    st.tuples(st.booleans(), st.integers(0, 40), st.lists(st.binary(max_size=3), max_size=3)),
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(threads=_THREAD_ROWS)
def test_thread_states_lists_exactly_the_threads_with_a_state_row_in_key_order(
        store_factory: StoreFactory, threads: dict[str, tuple[bool, int, list[bytes]]]) -> None:
    store = store_factory()
    rows: list[Change] = [(keys.awaiting_model_key("w"), b"request"), (keys.meta_key(b"m"), b"meta")]
    expected = []
    for thread_id, (has_state, history, seen) in threads.items():
        if has_state:
            rows.append((keys.state_key(thread_id), f"state of {thread_id}".encode()))
            expected.append((keys.thread_prefix(thread_id), thread_id, f"state of {thread_id}".encode()))
        rows.append((keys.config_key(thread_id), b"{}"))
        rows += [(keys.history_key(thread_id, seq), b"entry") for seq in range(history)]
        rows += [(keys.seen_key(thread_id, message_id.hex()), b"") for message_id in seen]
    store.apply(rows)
    assert list(thread_states(store)) == [(t, raw) for _, t, raw in sorted(expected)]


def test_apply_writes_a_batch_and_its_offsets(store_factory: StoreFactory) -> None:
    store = store_factory()
    store.put(b"gone", b"x")
    store.apply(
        [(b"a", b"1"), (b"b", b"2"), (b"gone", None)], StoreOffsets(changelog_offset=7, input_offset=42)
    )
    assert (store.get(b"a"), store.get(b"b"), store.get(b"gone")) == (b"1", b"2", None)
    if not isinstance(store, Overlay):  # an overlay stages rows; offsets go with its commit
        assert store.offsets() == StoreOffsets(changelog_offset=7, input_offset=42)


def test_offsets_are_none_on_a_fresh_store(store_factory: StoreFactory) -> None:
    assert store_factory().offsets() == StoreOffsets()


def test_meta_rows_are_not_thread_rows() -> None:
    assert keys.is_meta_key(keys.meta_key(keys.META_INPUT_OFFSET))
    assert not keys.is_meta_key(keys.state_key("t"))
    with pytest.raises(ValueError):
        keys.thread_prefix("")


@pytest.mark.parametrize("kind", ["memory", "rocks"])
def test_overlay_reads_its_writes_commits_in_one_batch_and_aborts(kind: str, tmp_path: Path) -> None:
    base: Store = RocksStore(tmp_path / "db") if kind == "rocks" else MemoryStore()
    base.apply([(b"p:1", b"old"), (b"p:2", b"keep"), (b"p:3", b"drop")])
    overlay = Overlay(base)
    overlay.put(b"p:1", b"new")
    overlay.delete(b"p:3")
    overlay.put(b"p:0", b"added")
    overlay.put(b"p:1", b"newer")
    assert list(overlay.iterate(b"p:")) == [(b"p:0", b"added"), (b"p:1", b"newer"), (b"p:2", b"keep")]
    assert base.get(b"p:1") == b"old"  # nothing reaches the store before the commit
    assert overlay.changes() == ((b"p:3", None), (b"p:0", b"added"), (b"p:1", b"newer"))
    overlay.commit(StoreOffsets(changelog_offset=3, input_offset=9))
    assert list(base.iterate(b"p:")) == [(b"p:0", b"added"), (b"p:1", b"newer"), (b"p:2", b"keep")]
    assert base.offsets() == StoreOffsets(3, 9)
    overlay.put(b"p:9", b"doomed")
    overlay.abort()
    assert base.get(b"p:9") is None and overlay.get(b"p:9") is None and overlay.changes() == ()
    if isinstance(base, RocksStore):
        base.close()


def test_rocks_store_survives_reopening(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db")
    store.apply([(keys.state_key("t"), b"s")], StoreOffsets(1, 2))
    store.close()
    again = RocksStore(tmp_path / "db")
    assert again.get(keys.state_key("t")) == b"s"
    assert again.offsets() == StoreOffsets(1, 2)
    again.close()


def test_a_rocks_store_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    wide = tmp_path / "made-by-an-older-run"
    wide.mkdir(mode=0o755)
    for path in (tmp_path / "fresh", wide):
        store = RocksStore(path)
        try:
            assert path.stat().st_mode & 0o777 == 0o700, oct(path.stat().st_mode)
        finally:
            store.close()


def test_a_rocks_store_opens_with_the_tuning_kv_names(tmp_path: Path) -> None:
    """What RocksDB itself recorded (its OPTIONS file) is what `kv` sets, not its defaults."""
    store = RocksStore(tmp_path / "tuned")
    try:
        written = max((tmp_path / "tuned").glob("OPTIONS-*")).read_text()
    finally:
        store.close()
    settings = dict(line.strip().split("=", 1) for line in written.splitlines() if "=" in line)
    assert settings["level0_file_num_compaction_trigger"] == str(kv.L0_COMPACTION_TRIGGER)
    assert settings["write_buffer_size"] == str(kv.MEMTABLE_BYTES)
    assert settings["memtable_whole_key_filtering"] == "true"
    assert float(settings["memtable_prefix_bloom_size_ratio"]) == kv.MEMTABLE_BLOOM_RATIO


def lookup(cache: RowCache, key: bytes) -> tuple[bool, bytes | None]:
    """(True, value or None for a deleted row) if `cache` holds `key`, else (False, None):
    what `RocksStore.get` reads from `RowCache.rows`."""
    return (True, cache.rows[key]) if key in cache.rows else (False, None)


def test_a_row_cache_keeps_the_latest_writes_within_its_bytes() -> None:
    cache = RowCache(3 * (64 + 2))  # three rows of a one-byte key and value
    cache.remember([(b"a", b"1"), (b"b", b"2"), (b"c", None)])
    assert (lookup(cache, b"a"), lookup(cache, b"c"), lookup(cache, b"z")) == ((True, b"1"), (True, None),
                                                                            (False, None))
    cache.remember([(b"a", b"3"), (b"d", b"4")])  # a rewritten row is the newest: b is the oldest
    assert lookup(cache, b"b") == (False, None) and lookup(cache, b"a") == (True, b"3") and len(cache) == 3
    cache.remember([(b"big", b"x" * 1000)])  # larger than the whole cache: nothing kept
    assert len(cache) == 0
    with pytest.raises(ValueError):
        RowCache(-1)


_KEYS = st.sampled_from([b"k%d" % i for i in range(6)])
_BATCHES = st.lists(st.lists(st.tuples(_KEYS, st.none() | st.binary(max_size=40)), max_size=5), max_size=12)


@settings(max_examples=60, deadline=None)
@given(batches=_BATCHES, cache_bytes=st.sampled_from([80, 200, 1 << 20]))
def test_a_row_cache_counts_exactly_the_bytes_of_the_rows_it_holds(
    batches: list[list[Change]], cache_bytes: int
) -> None:
    cache = RowCache(cache_bytes)
    for batch in batches:
        cache.remember(batch)
        held = cache.rows  # the accounting itself is what is checked
        assert cache._bytes == sum(len(k) + len(v or b"") + 64 for k, v in held.items())
        assert cache._bytes <= cache_bytes
        last = dict(batch)
        for key, value in last.items():
            assert lookup(cache, key) in ((True, value), (False, None))


def _evicted_oldest_first(model: dict[bytes, bytes | None], capacity: int) -> None:
    """The reference: pop the first-written row while the rows exceed `capacity`."""
    while model and sum(len(k) + len(v or b"") + 64 for k, v in model.items()) > capacity:
        del model[next(iter(model))]


@settings(max_examples=80, deadline=None)
@given(
    batches=_BATCHES,
    cache_bytes=st.sampled_from([0, 80, 200, 400, 1 << 20]),
    resizes=st.lists(st.sampled_from([0, 80, 150, 300, 1 << 20]), max_size=12),
)
def test_a_row_cache_evicts_exactly_the_oldest_writes_as_a_reference_model_does(
    batches: list[list[Change]], cache_bytes: int, resizes: list[int]
) -> None:
    cache, capacity = RowCache(cache_bytes), cache_bytes
    model: dict[bytes, bytes | None] = {}
    for i, batch in enumerate(batches):
        cache.remember(batch)
        if capacity:
            for key, value in batch:
                model.pop(key, None)
                model[key] = value
            _evicted_oldest_first(model, capacity)
        assert list(cache.rows.items()) == list(model.items())  # the same rows, in write order
        if i < len(resizes):
            capacity = resizes[i]
            cache.resize(capacity)
            _evicted_oldest_first(model, capacity)
            assert list(cache.rows.items()) == list(model.items())


_OPS = st.lists(
    st.one_of(st.tuples(st.just("write"), st.lists(st.tuples(_KEYS, st.none() | st.binary(max_size=40)),
                                                   max_size=5)),
              st.tuples(st.just("admit"), st.tuples(_KEYS, st.binary(max_size=40)))),
    max_size=16,
)


@settings(max_examples=80, deadline=None)
@given(ops=_OPS, cache_bytes=st.sampled_from([0, 80, 200, 400, 1 << 20]))
def test_a_row_cache_admits_a_found_row_it_does_not_hold_as_its_newest_as_a_reference_model_does(
    ops: list[tuple[str, object]], cache_bytes: int
) -> None:
    cache = RowCache(cache_bytes)
    model: dict[bytes, bytes | None] = {}
    for kind, arg in ops:
        if kind == "write":
            batch = arg
            assert isinstance(batch, list)
            cache.writing()
            cache.remember(batch)
            if cache_bytes:
                for key, value in batch:
                    model.pop(key, None)
                    model[key] = value
        else:
            key, value = arg  # type: ignore[misc]
            cache.admit(key, value, cache.writes)  # no write since the read: kept, unless held
            if cache_bytes and key not in model:
                model[key] = value
        _evicted_oldest_first(model, cache_bytes)
        assert list(cache.rows.items()) == list(model.items())
        assert cache._bytes == sum(len(k) + len(v or b"") + 64 for k, v in model.items())


def test_a_row_cache_does_not_admit_a_read_that_a_write_began_during() -> None:
    cache = RowCache(2 * (64 + 2))  # two rows of a one-byte key and value
    # A reader counts the writes, reads k = "0"; the writer then writes k = "1", and a later
    # write evicts it: kept now, the read would serve "0" after "1" was written.
    before = cache.writes
    cache.writing()
    cache.remember([(b"k", b"1")])
    cache.writing()
    cache.remember([(b"a", b"x"), (b"b", b"y")])
    cache.admit(b"k", b"0", before)
    assert lookup(cache, b"k") == (False, None)
    # A write begun and not yet remembered: the read may have seen either value; not kept.
    before = cache.writes
    cache.writing()
    cache.admit(b"k", b"0", before)
    assert lookup(cache, b"k") == (False, None)
    # Counted after the write began: the read may be the old value, kept until the write's
    # `remember` replaces it.
    during = cache.writes
    cache.admit(b"k", b"0", during)
    assert lookup(cache, b"k") == (True, b"0")
    cache.remember([(b"k", b"1")])
    assert lookup(cache, b"k") == (True, b"1")


def test_a_rocks_store_serves_a_row_it_found_from_memory_and_keeps_no_miss(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db", row_cache_bytes=2 * (64 + 4))  # about two rows
    try:
        store.apply([(b"cfg", b"c")])  # written once, read at every input (a config row)
        store.apply([(b"k1", b"1"), (b"k2", b"2")])  # later writes push it out
        assert lookup(store._recent, b"cfg") == (False, None)
        assert store.get(b"cfg") == b"c"  # from RocksDB, and kept
        assert lookup(store._recent, b"cfg") == (True, b"c")
        assert store.get(b"never") is None
        assert lookup(store._recent, b"never") == (False, None)
        store.apply([(b"cfg", b"d")])
        assert store.get(b"cfg") == b"d"
    finally:
        store.close()


def test_a_reader_thread_never_sees_a_row_go_back_while_the_writer_writes(tmp_path: Path) -> None:
    """The model stage reads the processor's store while its checkpoint loop writes it: a
    value a read found must never be kept over a newer write (each key's values only grow)."""
    store = RocksStore(tmp_path / "db", row_cache_bytes=4 * (64 + 12))  # evicts at most writes
    names = [b"k%d" % i for i in range(8)]
    rounds = 3000
    done = threading.Event()
    regressions: list[tuple[bytes, int, int]] = []

    def read() -> None:
        seen = dict.fromkeys(names, -1)
        while not done.is_set():
            for key in names:
                raw = store.get(key)
                value = -1 if raw is None else int(raw)
                if value < seen[key]:
                    regressions.append((key, seen[key], value))
                seen[key] = value

    reader = threading.Thread(target=read, name="reader")
    reader.start()
    try:
        for n in range(rounds):
            store.apply([(names[n % len(names)], b"%012d" % n)])
    finally:
        done.set()
        reader.join(timeout=120)
    try:
        assert not reader.is_alive() and regressions == []
        last = {names[n % len(names)]: n for n in range(rounds)}
        assert {key: int(store.get(key) or b"-1") for key in names} == last
    finally:
        store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=_BATCHES, cache_bytes=st.sampled_from([0, 80, 200, 1 << 20]))
def test_a_rocks_store_reads_what_a_memory_store_reads_whatever_its_row_cache_holds(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[Change]], cache_bytes: int
) -> None:
    rocks = RocksStore(tmp_path_factory.mktemp("db"), row_cache_bytes=cache_bytes)
    model = MemoryStore()
    try:
        for batch in batches:
            rocks.apply(batch)
            model.apply(batch)
            for key in sorted({k for k, _ in batch} | {b"k0"}):
                assert rocks.get(key) == model.get(key)
        assert list(rocks.iterate(b"k")) == list(model.iterate(b"k"))
    finally:
        rocks.close()


@pytest.mark.parametrize("length", [0, 1, POINT_READS_UP_TO, POINT_READS_UP_TO + 1, 20])
@pytest.mark.parametrize("gap", [None, 0, 3])
def test_chained_reads_by_seq_and_by_scan_give_the_same_entries_and_head(
    length: int, gap: int | None
) -> None:
    store = MemoryStore()
    entries = [HistoryEntry(seq, 1, f"m{seq}", UserEntry((TextBlock(f"text {seq}"),), interrupt=False))
               for seq in range(length)]
    store.apply([(keys.history_key("t", e.seq), encode_entry(e)) for e in entries if e.seq != gap])
    stored = [e for e in entries if e.seq != gap]
    assert _read_chained(store, "t", 0, length, GENESIS_HEAD) == (tuple(stored), chain(tuple(stored)))
    later = [e for e in stored if e.seq >= 2]
    assert _read_chained(store, "t", 2, length, GENESIS_HEAD) == (tuple(later), chain(tuple(later)))


def test_the_store_bounds_set_for_the_process_are_the_ones_a_store_opens_with(tmp_path: Path) -> None:
    before = kv._bounds
    try:
        made = kv._block_cache()  # the process's block cache and write buffers exist from here on
        buffers = kv._write_buffers()
        kv.configure_memory(replace(before, row_cache_bytes=1 << 20))
        store = RocksStore(tmp_path / "bounded")
        try:
            assert store._recent._capacity == (1 << 20) // len(kv._shared_rows)
        finally:
            store.close()
        assert kv._block_cache() is made and kv._write_buffers() is buffers
        assert buffers.get_buffer_size() == before.write_buffer_bytes
        # A block cache or a write buffer manager of another size would need another one:
        # refused, not ignored.
        with pytest.raises(RuntimeError, match="before any store opens"):
            kv.configure_memory(replace(before, block_cache_bytes=before.block_cache_bytes // 2))
        with pytest.raises(RuntimeError, match="before any store opens"):
            kv.configure_memory(replace(before, write_buffer_bytes=before.write_buffer_bytes // 2))
    finally:
        kv.configure_memory(before)


def test_the_stores_of_a_process_share_one_row_budget_and_a_closed_one_gives_its_share_back(
        tmp_path: Path) -> None:
    before = kv._bounds
    gc.collect()  # a store an earlier test left open, then dropped, stops sharing the budget
    budget = 20_000
    try:
        kv.configure_memory(replace(before, row_cache_bytes=budget))
        first = RocksStore(tmp_path / "first")
        rows = [(b"k%03d" % i, b"v" * 100) for i in range(100)]  # ~17 KB with the per-row cost
        first.apply(rows)
        alone, held_alone = first._recent._capacity, first._recent._bytes
        assert alone == budget // len(kv._shared_rows) and held_alone > alone // 2
        second = RocksStore(tmp_path / "second")
        try:
            shared = first._recent._capacity
            assert shared == second._recent._capacity == budget // len(kv._shared_rows) < alone
            assert first._recent._bytes <= shared < held_alone  # the oldest rows went at once
            assert sum(cache._capacity for cache in kv._shared_rows) <= budget
            assert [first.get(key) for key, _ in rows] == [value for _, value in rows]  # from RocksDB
        finally:
            second.close()
        assert first._recent._capacity == alone
        first.close()
        assert first._recent not in kv._shared_rows
    finally:
        kv.configure_memory(before)


def test_a_row_cache_resized_down_evicts_its_oldest_rows_and_resized_up_keeps_them() -> None:
    cache = RowCache(4 * (64 + 2))
    cache.remember([(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4")])
    cache.resize(2 * (64 + 2))
    assert [lookup(cache, k)[0] for k in (b"a", b"b", b"c", b"d")] == [False, False, True, True]
    cache.resize(10 * (64 + 2))
    assert len(cache) == 2 and cache._bytes == 2 * (64 + 2)


def test_a_closed_store_holds_no_rows_and_a_failed_or_dropped_one_gives_its_share_back(
        tmp_path: Path) -> None:
    before = kv._bounds
    gc.collect()
    budget = 20_000
    try:
        kv.configure_memory(replace(before, row_cache_bytes=budget))
        kept = RocksStore(tmp_path / "kept")
        alone = kept._recent._capacity
        # The same directory again: RocksDB's lock refuses the open, which takes no share.
        with pytest.raises(Exception, match=r"(?i)lock"):
            RocksStore(tmp_path / "kept")
        assert kept._recent._capacity == alone
        dropped = RocksStore(tmp_path / "dropped")  # never closed, only forgotten
        assert kept._recent._capacity < alone
        closed = RocksStore(tmp_path / "closed")
        closed.apply([(b"k", b"v")])
        closed.close()
        assert (closed._recent._capacity, len(closed._recent)) == (0, 0)
        assert closed._recent not in kv._shared_rows
        del dropped
        gc.collect()
        assert kept._recent._capacity == alone
        kept.close()
    finally:
        kv.configure_memory(before)


def test_many_stores_keep_their_memtables_within_the_process_budget(tmp_path: Path) -> None:
    stores = [RocksStore(tmp_path / f"p{i}") for i in range(48)]
    try:
        for round_ in range(100):
            for store in stores:
                store.apply([(b"k%d-%d" % (round_, j), b"x" * 200) for j in range(20)])
        # 48 x 100 x 20 rows of ~220 bytes (~20 MiB): each memtable's first arena block once
        # held 1 MiB against the budget, 48 MiB for 48 stores before a byte was written.
        assert kv._write_buffers().get_usage() <= kv._bounds.write_buffer_bytes * 1.1
    finally:
        for store in stores:
            store.close()


@pytest.mark.parametrize("bounds", [{"block_cache_bytes": 0}, {"write_buffer_bytes": 0},
                                    {"row_cache_bytes": -1}])
def test_store_bounds_out_of_range_are_refused(bounds: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="out of range"):
        kv.StoreMemory(**bounds)
    with pytest.raises(ValueError):
        RowCache(10).resize(-1)


def wal_bytes(root: Path) -> int:
    """What RocksDB's write-ahead log files under `root` hold (one store, or every partition's)."""
    return sum(f.stat().st_size for f in root.rglob("*.log"))


@pytest.mark.parametrize("wal", [True, False])
def test_a_store_without_a_write_ahead_log_writes_none_and_reads_the_same(tmp_path: Path, wal: bool) -> None:
    store = RocksStore(tmp_path / "db", wal=wal)
    try:
        store.apply([(b"k%d" % i, b"v" * 100) for i in range(50)])
        assert (wal_bytes(tmp_path / "db") > 0) is wal
        assert store.get(b"k7") == b"v" * 100 and len(list(store.iterate(b"k"))) == 50
    finally:
        store.close()
    with pytest.raises(ValueError, match="write-ahead log"):
        RocksStore(tmp_path / "other", wal=False, sync=True)
