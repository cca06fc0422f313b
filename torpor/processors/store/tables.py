"""Typed reads of the store's rows (layout in `keys.py`, bytes in `statecodec.py`).

The step and the model stage both read a thread's state and history from a `Store` (or
an `Overlay`, which sees the checkpoint's pending writes). These functions are the one
place that knows how a row's bytes become a value, so neither caller decodes keys itself.

Model-visible history (the rule of `history.py`): the latest `SummaryEntry`, then every
non-summary entry whose `seq >= summary.up_to_seq`; with no summary, every entry. The
step keeps the seq of the latest summary in the thread's `C` row, so finding it costs
one read, not a scan of the whole history.

`HistoryCache` serves the model stage's repeated reads of one thread's visible history
incrementally (see its docstring).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Final

from torpor.processors.fold.effects import RequestCompletion
from torpor.processors.fold.history import advance_bytes, advance_link, note_call_ids
from torpor.processors.fold.state import GENESIS_HEAD, ThreadState
from torpor.processors.store import keys
from torpor.processors.store.kv import Store
from torpor.processors.store.statecodec import (
    WITHOUT_ANSWERED,
    decode_entry,
    decode_request,
    decode_state,
    entry_canonical,
    read_entry_row,
)
from torpor.schemas.records import HistoryEntry, SummaryEntry


def load_state(store: Store, thread_id: str, *, writer: bool = False) -> ThreadState | None:
    """The thread's state, or None when the thread does not exist (or was deleted).

    `writer`: the caller is the only one that writes `store` (the step, on the checkpoint
    loop's thread), so no write can come between its reads and the state row is not read
    again to check them (below)."""
    prefix = keys.thread_prefix(thread_id)
    key = prefix + keys.STATE
    raw = store.get(key)
    while raw is not None:
        form = raw[:1]
        if form == b"{":  # the first form holds its config and answered ids: no other read
            return decode_state(raw, None, None, thread_id)
        config = store.get(prefix + keys.CONFIG)
        answered = store.get(prefix + keys.ANSWERED) if form == WITHOUT_ANSWERED else None
        # Several reads: a reader beside the folding thread (the model stage) could get a
        # state row and side rows of another moment (a deletion, a re-creation between them).
        # The state row read again is the same: the rows are one moment's (a side row
        # changes only with the state row: an answered call also appends to the history).
        again = raw if writer else store.get(key)
        if again == raw:
            return decode_state(raw, config, answered, thread_id)
        raw = again
    return None


SENDERS_KEPT: Final = 8
"""How many senders a seen row remembers for one message id (the latest): more than one
only when several senders reuse an id, which only a stranger does; bounded all the same."""
_DIGEST: Final = 16


def is_seen(store: Store, thread_id: str, message_id: str, sender: bytes) -> bool:
    """Whether `message_id` was remembered for the thread from `sender` (`step.sender_digest`):
    then a copy is a duplicate. From another sender it is not (finding F4: a stranger's
    input must not use up the id of a genuine one). An empty row, written before senders
    were kept, matches any sender."""
    return is_seen_in(store.get(keys.seen_key(thread_id, message_id)), sender)


def is_seen_in(row: bytes | None, sender: bytes) -> bool:
    """`is_seen` on the seen row already read (None: there is none)."""
    return row is not None and (row == b"" or _remembers(row, sender))


def _remembers(row: bytes, sender: bytes) -> bool:
    return any(row[i:i + _DIGEST] == sender for i in range(0, len(row), _DIGEST))


def with_sender(row: bytes | None, sender: bytes) -> bytes:
    """The seen row `row` (None: none yet) remembering `sender` too; past `SENDERS_KEPT` the
    oldest is dropped, but never the first: the sender whose input made the row keeps it
    spent, however many others reuse its id (review 20: eight senders a tenant's gateway
    may sign for pushed an operator's stop out, and its copy was applied again). An empty
    row from before senders were kept stays as it is."""
    if row is None:
        return sender
    if row == b"" or _remembers(row, sender):
        return row
    return row[:_DIGEST] + (row[_DIGEST:] + sender)[-(SENDERS_KEPT - 1) * _DIGEST:]


def read_entries(
    store: Store, thread_id: str, from_seq: int = 0, up_to_seq: int | None = None
) -> Iterator[HistoryEntry]:
    """Stored history entries with `from_seq <= seq < up_to_seq`, in seq order (a run of
    rows: read as `_read_chained` reads one, past the memo of rows just written)."""
    start = keys.history_key(thread_id, from_seq)
    for key, raw in store.iterate(keys.history_prefix(thread_id), start):
        if up_to_seq is not None and keys.seq_of_history_key(key) >= up_to_seq:
            return
        yield read_entry_row(raw)[0]


def read_prefix_within(
    store: Store, thread_id: str, up_to_seq: int, budget: int
) -> tuple[HistoryEntry, ...] | None:
    """Entries `0 <= seq < up_to_seq`, or None as soon as their encodings pass `budget` bytes.

    Reads at most about `budget` bytes of history whatever the prefix holds: a caller
    that can only use a prefix that fits (a fork's creation, one input) learns that it
    does not without holding a history that may be gigabytes in memory."""
    entries: list[HistoryEntry] = []
    for key, raw in store.iterate(keys.history_prefix(thread_id), keys.history_key(thread_id, 0)):
        if keys.seq_of_history_key(key) >= up_to_seq:
            break
        budget -= len(entry_canonical(raw))
        if budget < 0:
            return None
        entries.append(decode_entry(raw))
    return tuple(entries)


def read_entry(store: Store, thread_id: str, seq: int) -> HistoryEntry | None:
    raw = store.get(keys.history_key(thread_id, seq))
    return None if raw is None else decode_entry(raw)


def latest_summary_seq(store: Store, thread_id: str) -> int | None:
    raw = store.get(keys.summary_key(thread_id))
    return None if raw is None else keys.decode_seq(raw)


def visible_entries(
    store: Store, thread_id: str, from_seq: int = 0, up_to_seq: int | None = None
) -> tuple[HistoryEntry, ...]:
    """The model-visible entries of `[from_seq, up_to_seq)`: from the latest summary in range on."""
    summary_seq = latest_summary_seq(store, thread_id)
    in_range = (
        summary_seq is not None and summary_seq >= from_seq and (up_to_seq is None or summary_seq < up_to_seq)
    )
    if summary_seq is not None and not in_range:
        # The latest summary is outside the range: scan for one inside it (a spawn over an
        # older stretch of history, rare), else read the range as it is.
        entries = tuple(read_entries(store, thread_id, from_seq, up_to_seq))
        return _from_latest_summary(entries)
    if summary_seq is None:
        return tuple(read_entries(store, thread_id, from_seq, up_to_seq))
    summary = read_entry(store, thread_id, summary_seq)
    assert summary is not None and isinstance(summary.body, SummaryEntry), "the C row names a summary"
    start = max(from_seq, summary.body.up_to_seq)
    rest = (
        e for e in read_entries(store, thread_id, start, up_to_seq) if not isinstance(e.body, SummaryEntry)
    )
    return (summary, *rest)


def _from_latest_summary(entries: tuple[HistoryEntry, ...]) -> tuple[HistoryEntry, ...]:
    summaries = [e for e in entries if isinstance(e.body, SummaryEntry)]
    if not summaries:
        return entries
    latest = summaries[-1]
    assert isinstance(latest.body, SummaryEntry)
    cut = latest.body.up_to_seq
    return (latest, *(e for e in entries if not isinstance(e.body, SummaryEntry) and e.seq >= cut))


def thread_states(store: Store) -> Iterator[tuple[str, bytes]]:
    """Each thread with a state row and that row's bytes, in key order.

    On a `RocksStore`, one seek per thread: its other rows (a history of any length, its
    seen rows) are skipped, never read, so a scan of all threads costs what the threads
    do, not what their histories do (a thread deleted keeps its seen rows and has no
    state row). A `MemoryStore` or an `Overlay` copies the rest of its key range at each
    `iterate`, so there it is quadratic: fine for tests, not for a large store."""
    start = keys.prefix_end(keys.GLOBAL_PREFIX)
    while start is not None:
        first = next(store.iterate(b"", start), None)
        if first is None:
            return
        prefix = keys.thread_prefix_of(first[0])
        raw = store.get(prefix + keys.STATE)
        if raw is not None:
            yield keys.thread_of_prefix(prefix), raw
        start = keys.prefix_end(prefix)


def awaiting_requests(store: Store) -> Iterator[RequestCompletion]:
    """The completion requests of threads still `awaiting_model` (re-issued after a restart)."""
    for _, raw in store.iterate(keys.awaiting_model_prefix()):
        yield decode_request(raw)


class HistoryAppend:
    """The entries one input's fold appended to a thread, seqs `from_seq` on, and the chain
    heads before and after them, as the fold computed them: what a `HistoryCache` may add to
    a prefix it holds without reading the rows back (`HistoryCache.extend`). A plain class
    (`_Cached` says why)."""

    __slots__ = ("entries", "from_seq", "head_after", "head_before", "thread_id")

    def __init__(self, thread_id: str, from_seq: int, entries: tuple[HistoryEntry, ...],
                 head_before: str, head_after: str) -> None:
        self.thread_id = thread_id
        self.from_seq = from_seq
        self.entries = entries
        self.head_before = head_before
        self.head_after = head_after


class _Cached:
    """A thread's first `length` entries, decoded, the hash-chain head after them, when the
    thread was last served (`HistoryCache`'s count of `visible` calls), and the call ids the
    entries mention (`note_call_ids`: by the index of the first entry that does); never
    changed once made, but for `call_ids`, which the next `_Cached` of the same chain takes
    over and adds the ids of its new entries to (an id's index says which prefix holds it).
    A plain class, not a frozen dataclass: compiled, it is built without the interpreter (a
    dataclass's `__init__` is generated Python even there)."""

    __slots__ = ("call_ids", "entries", "head", "length", "served")

    def __init__(self, length: int, head: str, entries: tuple[HistoryEntry, ...], served: int,
                 call_ids: dict[str, int]) -> None:
        self.length = length
        self.head = head
        self.entries = entries
        self.served = served
        self.call_ids = call_ids


GHOSTS_KEPT: Final = 16_384
"""Threads not held whose last serve `HistoryCache` remembers (ids and a count: ~2 MiB at most)."""


POINT_READS_UP_TO: Final = 8
"""Entries read one `get` each rather than by a scan: what a turn appends to a cached history
(one or two entries), which the step has just written, so each get is served by the store's
row cache; a scan would open a RocksDB iterator for them. Longer stretches are scanned."""


def _read_chained(
    store: Store, thread_id: str, from_seq: int, up_to_seq: int, head: str
) -> tuple[tuple[HistoryEntry, ...], str]:
    """The stored entries `from_seq <= seq < up_to_seq` and the chain head after them, from
    `head`: each link hashes the row's own canonical bytes (`entry_canonical`), not a new encoding.
    """
    entries: list[HistoryEntry] = []
    if up_to_seq - from_seq <= POINT_READS_UP_TO:
        # What a turn appended: the rows the step just wrote, decoded from its memo.
        for raw in _rows_by_seq(store, thread_id, from_seq, up_to_seq):
            entries.append(decode_entry(raw))
            head = advance_bytes(head, entry_canonical(raw))
        return tuple(entries), head
    link = bytes.fromhex(head)
    for raw in _rows_by_scan(store, thread_id, from_seq, up_to_seq):
        entry, canonical = read_entry_row(raw)
        entries.append(entry)
        link = advance_link(link, canonical)
    return tuple(entries), link.hex()


def _rows_by_seq(store: Store, thread_id: str, from_seq: int, up_to_seq: int) -> Iterator[bytes]:
    for seq in range(from_seq, up_to_seq):
        raw = store.get(keys.history_key(thread_id, seq))
        if raw is None:  # a gap (a store read mid-change): the rest exactly as a scan reads it
            yield from _rows_by_scan(store, thread_id, seq, up_to_seq)
            return
        yield raw


def _rows_by_scan(store: Store, thread_id: str, from_seq: int, up_to_seq: int) -> Iterator[bytes]:
    start = keys.history_key(thread_id, from_seq)
    for key, raw in store.iterate(keys.history_prefix(thread_id), start):
        if keys.seq_of_history_key(key) >= up_to_seq:
            return
        yield raw


class HistoryCache:
    """The decoded histories of the threads served last, extended by what was appended since.

    The model stage needs a thread's whole model-visible history at every completion;
    re-reading and re-decoding it each time made a turn cost O(history) (quadratic per
    thread). While a thread lives its history only grows, so a cached prefix needs only
    the new entries read and decoded. A prefix is trusted only when the hash chain over it
    and the new entries ends on the state's `head`: a thread deleted and created again
    under the same id has another chain, and is read afresh. Served from the cache: a
    request covering the whole stored history of a thread without a summary (the common
    case); anything else is read as `visible_entries` reads it. At most `capacity`
    entries are kept, the least recently served threads evicted first: the memory is
    bounded, not per agent. After each commit the runtimes hand it what the step appended
    (`extend`), so a held thread's next request reads none of its rows back: those reads,
    each a RocksDB get, a hash and a decode, were about 4% of a local completion.

    Admission. Threads served in turn whose histories together exceed the capacity made a
    cache that admits every thread it reads useless: each one read evicted the one served
    next, and every completion read its whole history (200 agents x 100 turns, 400 entries
    each against 49,152: 1,530 us per local completion, 272 at 100 agents). So once the
    cache is full, a thread read whole is kept only by evicting threads served longer ago
    than the thread itself was last served (`GHOSTS_KEPT` remembers when, for threads not
    held), and never on its first serve: threads that keep coming round hold their places
    (a stable share of them is served from memory), while threads gone idle give theirs to
    the ones now running from their second request on.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"a history cache needs capacity >= 0, not {capacity}")
        self._capacity = capacity
        self._threads: OrderedDict[str, _Cached] = OrderedDict()  # least recently served first
        self._entries = 0  # held over all threads
        self._served = 0  # `visible` calls so far: the clock of `_Cached.served`
        self._ghosts: OrderedDict[str, int] = OrderedDict()  # threads not held: when last served

    def visible(self, store: Store, state: ThreadState, up_to_seq: int) -> tuple[HistoryEntry, ...]:
        """What `visible_entries(store, thread, 0, up_to_seq)` returns, for `state`'s thread."""
        thread_id = state.thread_id
        if self._capacity == 0 or up_to_seq != state.history_len:
            return visible_entries(store, thread_id, 0, up_to_seq)
        self._served += 1
        cached = self._threads.pop(thread_id, None)
        entries: tuple[HistoryEntry, ...] | None = None
        call_ids: dict[str, int] = {}
        if cached is not None:
            self._entries -= len(cached.entries)
            if cached.length <= up_to_seq:
                new, head = _read_chained(store, thread_id, cached.length, up_to_seq, cached.head)
                # The summary row is written with its SummaryEntry, in one batch: a chain that
                # ends on the state's head through entries without one has none, so the
                # summary row is not read (a RocksDB read that misses, per completion).
                if head == state.head and not any(isinstance(e.body, SummaryEntry) for e in new):
                    entries = cached.entries + new
                    call_ids = cached.call_ids
                    note_call_ids(new, cached.length, call_ids)
        if entries is None:
            last_served = cached.served if cached is not None else self._ghosts.pop(thread_id, None)
            if latest_summary_seq(store, thread_id) is not None:
                self._remember(thread_id)
                return visible_entries(store, thread_id, 0, up_to_seq)
            entries, head = _read_chained(store, thread_id, 0, up_to_seq, GENESIS_HEAD)
            if head != state.head or not self._admit(len(entries), last_served):
                # Not kept: read while the thread changed under us, or no room it may take.
                self._remember(thread_id)
                return entries
            note_call_ids(entries, 0, call_ids)
        self._threads[thread_id] = _Cached(up_to_seq, state.head, entries, self._served, call_ids)
        self._entries += len(entries)
        self._evict()  # a held thread grown past the capacity; an admitted one made its room
        return entries

    def call_ids(self, thread_id: str, history: tuple[HistoryEntry, ...]) -> Mapping[str, int] | None:
        """The call ids of `history` by the index of the first entry that mentions them
        (`note_call_ids`), if `history` is what `visible` just returned for `thread_id` from
        this cache (else None): the map may go on to later entries of the same chain, as
        they are appended (`held_call_ids` counts only the first `len(history)`). Bounded
        with the entries: at most as many ids as the held entries mention."""
        cached = self._threads.get(thread_id)
        if cached is None or cached.entries is not history:
            return None
        return cached.call_ids

    def _admit(self, size: int, last_served: int | None) -> bool:
        """Whether a thread of `size` entries, last served at `last_served` (None: never, that
        this cache remembers), may be kept; if so, the threads it displaces are evicted."""
        room = self._capacity - self._entries
        if size <= room:
            return True
        if last_served is None or size > self._capacity:
            return False
        freed = 0
        displaced = 0
        for held in self._threads.values():  # least recently served first
            if held.served >= last_served or size <= room + freed:
                break
            freed += len(held.entries)
            displaced += 1
        if size > room + freed:
            return False
        for _ in range(displaced):
            self._drop_oldest()
        return True

    def _remember(self, thread_id: str, served: int | None = None) -> None:
        """Remember when `thread_id`, not held, was last served (now, by default)."""
        self._ghosts[thread_id] = self._served if served is None else served
        self._ghosts.move_to_end(thread_id)
        if len(self._ghosts) > GHOSTS_KEPT:
            self._ghosts.popitem(last=False)

    def extend(self, appended: HistoryAppend) -> None:
        """Add what a committed fold appended to the thread's cached prefix, when the prefix
        ends exactly where the append starts (its length and its chain head): the next
        `visible` then reads no row back. Called after the commit, on the thread that calls
        `visible`, never for a checkpoint that aborted: the cache only ever holds rows that
        are in the store. A thread not held stays out (it is read whole when it is served:
        a thread that may never be served must not evict one that will); an append holding
        a `SummaryEntry` drops the thread (`visible` reads a summarised history as
        `visible_entries` does); any other mismatch leaves the prefix as it is, which
        `visible` checks against the state's head anyway."""
        thread_id = appended.thread_id
        cached = self._threads.get(thread_id)
        if cached is None:
            return
        entries = appended.entries
        if not entries:
            return
        if any(isinstance(e.body, SummaryEntry) for e in entries):
            del self._threads[thread_id]
            self._entries -= len(cached.entries)
            self._remember(thread_id, cached.served)
            return
        if cached.length != appended.from_seq or cached.head != appended.head_before or (
                entries[-1].seq != appended.from_seq + len(entries) - 1):
            return
        note_call_ids(entries, cached.length, cached.call_ids)
        self._threads[thread_id] = _Cached(cached.length + len(entries), appended.head_after,
                                           cached.entries + entries, cached.served, cached.call_ids)
        self._entries += len(entries)
        self._evict()

    def _evict(self) -> None:
        """Drop the least recently served threads until the entries fit the capacity."""
        while self._entries > self._capacity and self._threads:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        """Evict the least recently served thread, remembering when it was served."""
        gone, evicted = self._threads.popitem(last=False)
        self._entries -= len(evicted.entries)
        self._remember(gone, evicted.served)

    def __len__(self) -> int:
        """How many threads are held."""
        return len(self._threads)

    @property
    def held_entries(self) -> int:
        """How many entries are held over all threads. An int read: safe from a metrics
        scrape on another thread (which may catch `visible` between adding a thread's
        entries and evicting others, a moment over the capacity)."""
        return self._entries

