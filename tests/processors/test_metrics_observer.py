"""`ProcessorMetrics` as an observer, without a broker: it counts only what it is told
was committed, reads the parked gauge from the committed store, and keeps its labels
bounded whatever a thread names as its model."""

from __future__ import annotations

import gc
from pathlib import Path

from tests.processors.fold_scenarios import completion, control, create
from tests.processors.test_step import Feed, envelope
from torpor.processors.metrics import ProcessorMetrics, provider_of
from torpor.processors.observing import CommittedWork
from torpor.processors.step import step
from torpor.processors.store import keys
from torpor.processors.store.kv import (
    BLOCK_CACHE_BYTES,
    ROW_CACHE_BYTES,
    WRITE_BUFFER_BYTES,
    RocksStore,
    cache_use,
)
from torpor.processors.store.tables import HistoryCache, load_state
from torpor.schemas.records import CompletionError


def _value(metrics: ProcessorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_committed_work_is_counted_by_disposition_and_the_parked_gauge_follows_the_store(
        tmp_path: Path) -> None:
    store, feed = RocksStore(tmp_path / "partition-0"), Feed()
    metrics = ProcessorMetrics()
    metrics.partition_started(0, store, None)
    first = step(store, feed(envelope("m-create", create()), envelope("m-create", create())))
    park = envelope("m-park", control("park", reason="look"), source="operator:o")
    second = step(store, feed(park))
    metrics.partition_committed(CommittedWork(0, (first, second), poisoned=1, input_offset=3), store)
    assert _value(metrics, "torpor_inputs_total", disposition="applied", reason="") == 2
    assert _value(metrics, "torpor_inputs_total", disposition="duplicate", reason="") == 1
    assert _value(metrics, "torpor_inputs_total", disposition="parked", reason="") == 1  # the poisoned one
    assert _value(metrics, "torpor_parked_threads") == 1
    assert metrics.owned() == {0: (store.path, 3, None)}
    assert _value(metrics, "torpor_store_bytes", partition="0") is not None
    # A scrape without a watermark source reports no lag rather than a made-up one.
    assert _value(metrics, "torpor_consumer_lag", partition="0") is None
    metrics.track_lag(lambda partition: 10)
    metrics.committed(0.01)  # the end is read on the loop's thread, at a commit
    assert _value(metrics, "torpor_consumer_lag", partition="0") == 7
    metrics.partition_closed(0)
    assert _value(metrics, "torpor_parked_threads") == 0
    assert _value(metrics, "torpor_store_bytes", partition="0") is None
    store.close()


def test_the_caches_fill_is_read_from_the_caches_when_scraped(tmp_path: Path) -> None:
    """The gauges are the caches' own counters, not the bounds: the row cache counts the
    rows a step wrote, RocksDB's write buffer manager its memtables, the history cache its
    entries. They are for the whole process (every store it opened), so at least these."""
    gc.collect()  # other tests' dropped stores give back their shares now, not mid-test
    store, feed = RocksStore(tmp_path / "partition-0"), Feed()
    metrics = ProcessorMetrics()
    metrics.partition_started(0, store, None)
    step(store, feed(envelope("m-create", create())))
    written = sum(len(k) + len(v) for k, v in store.iterate(b""))
    assert written > 0
    # Not the bounds: this one step's rows, far under the row budget; the memtables hold an
    # arena block from their first write, far under the write buffers' budget.
    rows = _value(metrics, "torpor_cache_bytes", cache="rows")
    assert rows is not None and written <= rows < ROW_CACHE_BYTES // 2
    memtables = _value(metrics, "torpor_cache_bytes", cache="memtables")
    assert memtables is not None and 0 < memtables < WRITE_BUFFER_BYTES
    assert cache_use().rows >= written
    block = _value(metrics, "torpor_cache_bytes", cache="block")
    assert block is not None and 0 <= block < BLOCK_CACHE_BYTES
    # No history cache told: no gauge, rather than a made-up 0.
    assert _value(metrics, "torpor_history_cache_entries") is None
    histories = HistoryCache(100)
    metrics.track_histories(histories)
    assert _value(metrics, "torpor_history_cache_entries") == 0
    state = load_state(store, "t1")
    assert state is not None
    held = histories.visible(store, state, state.history_len)
    assert held and _value(metrics, "torpor_history_cache_entries") == len(held) == histories.held_entries
    metrics.partition_closed(0)
    store.close()


def test_a_restarted_partition_finds_its_parked_threads_in_the_store(tmp_path: Path) -> None:
    """Four threads with histories are parked; then one is deleted (its seen rows stay) and
    two unparked, one of them named "parked" (its state row holds the word: read, decoded,
    not counted). The gauge counts the one still parked."""
    store, feed = RocksStore(tmp_path / "partition-0"), Feed()
    operator = "operator:o"
    for thread in ("still", "deleted", "unparked", "parked"):
        step(store, feed(envelope(f"{thread}-create", create(), thread)))
        step(store, feed(envelope(f"{thread}-park", control("park", reason="look"), thread, operator)))
    step(store, feed(envelope("deleted-delete", control("delete", reason="gone"), "deleted", operator),
                     envelope("unparked-unpark", control("unpark"), "unparked", operator),
                     envelope("parked-unpark", control("unpark"), "parked", operator)))
    named = store.get(keys.state_key("parked"))
    assert named is not None and b'"parked"' in named  # the word is there: the gauge must decode
    metrics = ProcessorMetrics()
    metrics.partition_started(0, store, 9)
    assert _value(metrics, "torpor_parked_threads") == 1
    store.close()


def test_checkpoints_and_completions_are_counted_by_outcome_and_provider() -> None:
    metrics = ProcessorMetrics()
    metrics.committed(0.02)
    metrics.aborted("CheckpointAbortedError")
    metrics.completion_published("openai:gpt-4o-mini", 1.5, completion("r1", "hi", total_tokens=30))
    assert _value(metrics, "torpor_checkpoint_commit_seconds_count") == 1
    assert _value(metrics, "torpor_transaction_aborts_total", cause="CheckpointAbortedError") == 1
    assert _value(metrics, "torpor_completions_total", provider="openai", outcome="ok") == 1
    assert _value(metrics, "torpor_model_seconds_sum", provider="openai", outcome="ok") == 1.5
    usage = completion("r1", "hi", total_tokens=30).usage
    assert _value(metrics, "torpor_model_tokens_total", provider="openai",
                  direction="output") == usage.output_tokens


def test_each_completion_counts_in_its_own_provider_and_outcome() -> None:
    # The series are found once per label pair and kept: later completions of a pair, and
    # other pairs, must still land where `labels()` would have put them.
    metrics = ProcessorMetrics()
    ok = completion("r1", "hi", total_tokens=30)
    failed = completion("r2", error=CompletionError(kind="permanent", message="no", attempts=1))
    for model, body, seconds in [("openai:a", ok, 1.0), ("openai:b", ok, 2.0), ("openai:a", failed, 4.0),
                                 ("anthropic:c", ok, 8.0)]:
        metrics.completion_published(model, seconds, body)
    assert _value(metrics, "torpor_completions_total", provider="openai", outcome="ok") == 2
    assert _value(metrics, "torpor_completions_total", provider="openai", outcome="error") == 1
    assert _value(metrics, "torpor_completions_total", provider="anthropic", outcome="ok") == 1
    assert _value(metrics, "torpor_model_seconds_sum", provider="openai", outcome="ok") == 3.0
    assert _value(metrics, "torpor_model_seconds_sum", provider="openai", outcome="error") == 4.0
    assert _value(metrics, "torpor_model_tokens_total", provider="openai", direction="input") == \
        2 * ok.usage.input_tokens + failed.usage.input_tokens
    assert _value(metrics, "torpor_model_tokens_total", provider="anthropic", direction="output") == \
        ok.usage.output_tokens


def test_a_model_string_from_an_input_cannot_grow_the_provider_label() -> None:
    assert provider_of("anthropic:claude") == "anthropic"
    assert provider_of("scripted") == "scripted"
    assert provider_of("x" * 500 + ":y") == "other"
    assert provider_of("") == "other"
