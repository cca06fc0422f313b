"""Prometheus metrics of a processor, counted from what its checkpoints commit.

Contract. `ProcessorMetrics` is a `ProcessorObserver` (`processors.observing`): give it to
`Processor(..., observer=metrics)` and it counts into its own `CollectorRegistry`
(`registry`, served on `/metrics` by the command line):

  torpor_inputs_total{disposition,reason}   inputs folded, by their receipt's disposition
                                            (`rejected:<reason>` as `rejected`, the reason in
                                            its own label; empty for the others)
  torpor_dispatches_total                   dispatches committed to the outbox
  torpor_parked_threads                     threads of the owned partitions whose status is parked
  torpor_checkpoint_commit_seconds          histogram: time to commit a checkpoint (its markers,
                                            flush, send offsets, commit, apply to RocksDB); its
                                            `_count` is the checkpoints committed
  torpor_transaction_aborts_total{cause}    transactions aborted, by the error class that made
                                            the loop abort them
  torpor_completions_total{provider,outcome} completions the model stage published (`ok`, `error`)
  torpor_model_seconds{provider,outcome}    histogram: a completion's provider calls, every
                                            attempt and backoff included
  torpor_model_tokens_total{provider,direction} tokens the providers reported (`input`, `output`)
  torpor_consumer_lag{partition}            per owned `inputs` partition: its end (the last stable
                                            offset, as the consumer last heard it) minus the
                                            committed offset. Kafka's own definition, so a
                                            transaction marker at the end counts as 1
  torpor_store_bytes{partition}             per owned partition: its RocksDB directory's size on disk
  torpor_cache_bytes{cache}                 what the process's bounded caches hold now: `block`
                                            (RocksDB's block cache), `memtables` (as its write
                                            buffer manager counts them), `rows` (the row caches)
  torpor_history_cache_entries              decoded history entries the model stage keeps

`provider` is the model string's API (`openai`, `anthropic`, `bedrock`, `scripted`; any
other string a thread names is `other`, so a label never grows with what inputs say).

Exactness. Inputs, dispatches and the parked gauge move only when a checkpoint commits
(`partition_committed`): an aborted checkpoint's work is dropped and folded again, so
after a run the inputs counted by disposition are exactly the receipts on `receipts`.
Lag, store size and the caches are read when scraped (on the scrape's thread: the
committed offsets this observer was told, the consumer's cached watermark, the files'
sizes, the caches' own counters). Each cache is bounded by this process's share of
`[memory]`; the block cache and the row caches fill up to it and stay there, the
memtables fall back at each flush. Resident memory minus these is what grows with the
agents.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from torpor.processors.fold.state import Status
from torpor.processors.models.providers.registry import Backend
from torpor.processors.observing import CommittedWork
from torpor.processors.store.kv import RocksStore, Store, cache_use
from torpor.processors.store.tables import HistoryCache, load_state, thread_states
from torpor.schemas.records import Completion

# What a parked thread's state row holds (`"status":"parked"`): the scan decodes only rows
# that have it.
_PARKED_TEXT: Final = b'"' + Status.PARKED.value.encode() + b'"'
# Events after which a thread's parked-or-not is read again from its committed state.
_PARK_KINDS: Final = frozenset({"parked", "unparked", "stopped", "resumed", "deleted", "closed"})
_COMMIT_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A completion takes from a few ms (scripted) to minutes (a long answer with retries).
_MODEL_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_PROVIDERS: Final = frozenset(backend.value for backend in Backend)
OTHER_PROVIDER: Final = "other"

Watermark = Callable[[int], "int | None"]
"""The end offset of an `inputs` partition, or None when not known (`Processor.high_watermark`)."""


def provider_of(model: str) -> str:
    """The provider label of a model string: its API, or `other` (bounded cardinality)."""
    head = model.strip().partition(":")[0]
    return head if head in _PROVIDERS else OTHER_PROVIDER


@dataclass(slots=True)
class _Owned:
    """What the scrape reads of one owned partition."""

    store_path: Path
    committed: int | None
    parked: set[str] = field(default_factory=set)
    # The partition's end as last read on the loop's thread: a scrape never calls the
    # consumer (from another thread it can wait behind the loop's consume without end).
    high: int | None = None


@dataclass(frozen=True, slots=True)
class _ModelChildren:
    """The series one completion updates, for one provider and outcome."""

    completions: PromCounter
    seconds: Histogram
    input_tokens: PromCounter
    output_tokens: PromCounter


class ProcessorMetrics:
    """The processor's metrics, in a registry of their own (so two processors in one process,
    as in tests, never share counters). See the module docstring."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry = registry or CollectorRegistry()
        self._lock = threading.Lock()  # `_owned`: written on the loop's thread, read by scrapes
        self._owned: dict[int, _Owned] = {}
        self._watermark: Watermark | None = None
        self._histories: HistoryCache | None = None
        self.inputs = PromCounter("torpor_inputs", "Inputs folded, by receipt disposition.",
                                  ["disposition", "reason"], registry=registry)
        self.dispatches = PromCounter("torpor_dispatches", "Dispatches committed to the outbox.",
                                      registry=registry)
        self.parked = Gauge("torpor_parked_threads", "Parked threads of the owned partitions.",
                            registry=registry)
        self.commit_seconds = Histogram("torpor_checkpoint_commit_seconds",
                                        "Time to commit a checkpoint (transaction and store).",
                                        buckets=_COMMIT_BUCKETS, registry=registry)
        self.aborts = PromCounter("torpor_transaction_aborts", "Transactions aborted, by cause.",
                                  ["cause"], registry=registry)
        self.completions = PromCounter("torpor_completions", "Completions the model stage published.",
                                       ["provider", "outcome"], registry=registry)
        self.model_seconds = Histogram("torpor_model_seconds",
                                       "Provider time of a completion, retries included.",
                                       ["provider", "outcome"], buckets=_MODEL_BUCKETS, registry=registry)
        self.tokens = PromCounter("torpor_model_tokens", "Tokens the providers reported.",
                                  ["provider", "direction"], registry=registry)
        # Each completion's four series, found once per label pair: `labels()` takes a lock
        # and builds its key each time, 11 us of a completion's four updates. The labels are
        # bounded (`provider_of`), so is this.
        self._model_children: dict[tuple[str, str], _ModelChildren] = {}
        registry.register(_PartitionCollector(self))

    def track_lag(self, watermark: Watermark) -> None:
        """Report `torpor_consumer_lag` from `watermark` (the processor's, once it exists)."""
        self._watermark = watermark

    def track_histories(self, histories: HistoryCache) -> None:
        """Report `torpor_history_cache_entries` from `histories` (the processor's stage cache)."""
        self._histories = histories

    def history_entries(self) -> int | None:
        return None if self._histories is None else self._histories.held_entries

    # --- the loop (streams.checkpoints.CheckpointObserver) ------------------------------

    def committed(self, seconds: float) -> None:
        self.commit_seconds.observe(seconds)
        # Every owned partition's end, read here on the loop's thread (idle ones included).
        with self._lock:
            partitions = list(self._owned)
        highs = {p: self.watermark(p) for p in partitions}
        with self._lock:
            for partition, high in highs.items():
                if (owned := self._owned.get(partition)) is not None and high is not None:
                    owned.high = high

    def aborted(self, cause: str) -> None:
        self.aborts.labels(cause).inc()

    # --- the partitions ------------------------------------------------------------------

    def partition_started(self, partition: int, store: RocksStore, input_offset: int | None) -> None:
        # Once per assignment, the parked gauge: every thread's state row, one seek each
        # (`thread_states`); only a row that has the word is decoded (a parked thread's
        # row says `"status":"parked"`; a word inside a JSON string could too, so decode).
        parked = {t for t, raw in thread_states(store) if _PARKED_TEXT in raw and _is_parked(store, t)}
        high = self.watermark(partition)
        with self._lock:
            self._owned[partition] = _Owned(store.path, input_offset, parked, high=high)
        self._set_parked()

    def partition_committed(self, work: CommittedWork, store: RocksStore) -> None:
        dispositions: Counter[tuple[str, str]] = Counter()
        dispatches = 0
        touched: set[str] = set()
        for output in work.steps:
            for receipt in output.receipts:
                kind, _, reason = receipt.disposition.partition(":")
                dispositions[(kind, reason)] += 1
            dispatches += len(output.dispatches)
            touched.update(e.thread_id for e in output.events if e.kind in _PARK_KINDS)
        high = self.watermark(work.partition)  # on the loop's thread, after its commit
        if work.poisoned:
            dispositions[("parked", "")] += work.poisoned
        for (disposition, reason), count in dispositions.items():
            self.inputs.labels(disposition, reason).inc(count)
        if dispatches:
            self.dispatches.inc(dispatches)
        with self._lock:
            owned = self._owned.get(work.partition)
            if owned is None:
                return
            owned.committed = work.input_offset
            owned.high = high
            for thread in touched:
                if _is_parked(store, thread):
                    owned.parked.add(thread)
                else:
                    owned.parked.discard(thread)
        if touched:
            self._set_parked()

    def partition_closed(self, partition: int) -> None:
        with self._lock:
            self._owned.pop(partition, None)
        self._set_parked()

    # --- the model stage (models.stage.CompletionObserver) -------------------------------

    def completion_published(self, model: str, seconds: float, completion: Completion) -> None:
        provider = provider_of(model)
        outcome = "error" if completion.error is not None else "ok"
        children = self._model_children.get((provider, outcome))
        if children is None:
            children = self._model_children[(provider, outcome)] = _ModelChildren(
                self.completions.labels(provider, outcome), self.model_seconds.labels(provider, outcome),
                self.tokens.labels(provider, "input"), self.tokens.labels(provider, "output"))
        children.completions.inc()
        children.seconds.observe(seconds)
        children.input_tokens.inc(max(0, completion.usage.input_tokens))
        children.output_tokens.inc(max(0, completion.usage.output_tokens))

    # --- read by the scrape ----------------------------------------------------------------

    def owned(self) -> dict[int, tuple[Path, int | None, int | None]]:
        """Each owned partition's store directory, committed offset and end as last read."""
        with self._lock:
            return {p: (o.store_path, o.committed, o.high) for p, o in self._owned.items()}

    def watermark(self, partition: int) -> int | None:
        return None if self._watermark is None else self._watermark(partition)

    def _set_parked(self) -> None:
        with self._lock:
            count = sum(len(owned.parked) for owned in self._owned.values())
        self.parked.set(count)


class _PartitionCollector(Collector):
    """`torpor_consumer_lag`, `torpor_store_bytes` and the caches' fill, computed when scraped."""

    def __init__(self, metrics: ProcessorMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        lag = GaugeMetricFamily("torpor_consumer_lag", "Inputs not yet committed, per owned partition.",
                                labels=["partition"])
        size = GaugeMetricFamily("torpor_store_bytes", "RocksDB store size on disk, per owned partition.",
                                 labels=["partition"])
        for partition, (path, committed, high) in sorted(self._metrics.owned().items()):
            if high is not None:
                lag.add_metric([str(partition)], float(max(0, high - (committed or 0))))
            size.add_metric([str(partition)], float(_directory_bytes(path)))
        yield lag
        yield size
        use = cache_use()
        caches = GaugeMetricFamily("torpor_cache_bytes", "What the process's bounded caches hold now.",
                                   labels=["cache"])
        for cache, held in (("block", use.block_cache), ("memtables", use.memtables), ("rows", use.rows)):
            caches.add_metric([cache], float(held))
        yield caches
        if (entries := self._metrics.history_entries()) is not None:
            yield GaugeMetricFamily("torpor_history_cache_entries",
                                    "Decoded history entries the model stage keeps.", value=float(entries))


def _directory_bytes(path: Path) -> int:
    """The bytes of the files in `path` (a RocksDB directory is flat); files that vanish
    mid-scan (a compaction) are skipped."""
    total = 0
    try:
        entries = list(os.scandir(path))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total


def _is_parked(store: Store, thread_id: str) -> bool:
    state = load_state(store, thread_id)
    return state is not None and state.status is Status.PARKED
