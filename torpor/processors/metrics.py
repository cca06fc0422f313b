"""Prometheus metrics of a processor, counted from what its checkpoints commit.

Contract. `MeteredProcessor` is a `Processor` that counts, into its own
`CollectorRegistry` (`metrics`), and `serve_metrics(registry, host, port)` serves it on
`/metrics`:

  torpor_inputs_total{disposition}          inputs folded, by their receipt's disposition
                                            (`rejected:<reason>` as `rejected`, the reason
                                            in its own label)
  torpor_dispatches_total                   records committed to the outbox
  torpor_completions_total{outcome}         completions the model stage produced (`ok`, `error`)
  torpor_checkpoint_commit_seconds{outcome} how long committing a checkpoint took (produce
                                            its markers, flush, send the offsets, commit the
                                            transaction, apply it to RocksDB), by `committed`
                                            or `aborted`
  torpor_checkpoints_total{outcome}         checkpoints committed and aborted
  torpor_parked_threads                     threads of the owned partitions whose status is parked

Counts are taken only when a checkpoint commits: the records a `ThreadTask` returns
are held per partition and counted by `commit` (dropped by `abort`), so after a run the
inputs counted by disposition are exactly the receipts on the `receipts` topic.

The seam, chosen so the processor and the loop need no change: `MeteredProcessor`
overrides `_open_task`, the task factory it hands the loop, to wrap each `ThreadTask`
in a `MeteredTask` (the same `PartitionTask` protocol); it wraps the loop's public
`commit_checkpoint` to time it, and the stage's sink to count completions.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server
from prometheus_client import Counter as PromCounter

from torpor.processors.fold.state import Status
from torpor.processors.models.stage import StageSink
from torpor.processors.processor import Processor, ThreadTask
from torpor.processors.replay import thread_ids
from torpor.processors.store.kv import Store
from torpor.processors.store.tables import load_state
from torpor.schemas.codec import Codec
from torpor.schemas.errors import ConfigError, DecodeError
from torpor.schemas.records import Completion, Input, Receipt, ThreadEvent
from torpor.streams.deadline import Deadline
from torpor.streams.task import Change, InputRecord, StoredOffsets, TaskOutput
from torpor.streams.topics import TopicNames

# Events after which a thread's parked-or-not is read again from its committed state.
T = TypeVar("T")

_PARK_KINDS: Final = frozenset({"parked", "unparked", "stopped", "resumed", "deleted", "closed"})
_COMMIT_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True, slots=True)
class ProcessorMetrics:
    """The processor's metrics, in a registry of their own (so two processors in one process,
    as in tests, never share counters)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    inputs: PromCounter = field(init=False)
    dispatches: PromCounter = field(init=False)
    completions: PromCounter = field(init=False)
    commit_seconds: Histogram = field(init=False)
    checkpoints: PromCounter = field(init=False)
    parked: Gauge = field(init=False)

    def __post_init__(self) -> None:
        make = object.__setattr__
        make(self, "inputs", PromCounter("torpor_inputs", "Inputs folded, by receipt disposition.",
                                         ["disposition", "reason"], registry=self.registry))
        make(self, "dispatches", PromCounter("torpor_dispatches", "Dispatches committed to the outbox.",
                                             registry=self.registry))
        make(self, "completions", PromCounter("torpor_completions", "Completions the model stage produced.",
                                              ["outcome"], registry=self.registry))
        make(self, "commit_seconds", Histogram("torpor_checkpoint_commit_seconds",
                                               "Time to commit a checkpoint (transaction and store).",
                                               ["outcome"], buckets=_COMMIT_BUCKETS, registry=self.registry))
        make(self, "checkpoints", PromCounter("torpor_checkpoints", "Checkpoints committed or aborted.",
                                              ["outcome"], registry=self.registry))
        make(self, "parked", Gauge("torpor_parked_threads", "Parked threads of the owned partitions.",
                                   registry=self.registry))


@dataclass(slots=True)
class _Pending:
    """What one partition's open checkpoint will count if it commits."""

    dispositions: Counter[tuple[str, str]] = field(default_factory=Counter)
    dispatches: int = 0
    touched: set[str] = field(default_factory=set)


class MeteredTask:
    """A `ThreadTask` whose committed outputs are counted (the module docstring)."""

    def __init__(self, task: ThreadTask, metrics: ProcessorMetrics, codec: Codec, topics: TopicNames,
                 parked: dict[int, set[str]]) -> None:
        self._task = task
        self._metrics = metrics
        self._codec = codec
        self._topics = topics
        self._parked = parked  # partition -> parked threads, shared by the processor's tasks
        self._pending = _Pending()

    def offsets(self) -> StoredOffsets:
        return self._task.offsets()

    def restore(self, changes: Sequence[Change], offsets: StoredOffsets) -> None:
        self._task.restore(changes, offsets)

    def start(self) -> None:
        self._task.start()
        store = self._task._store  # the partition's store, restored: read once for the parked gauge
        self._parked[self._task.partition] = {t for t in thread_ids(store) if _is_parked(store, t)}
        self._set_parked()

    def process(self, records: Sequence[InputRecord]) -> TaskOutput:
        output = self._task.process(records)
        pending = self._pending
        for out in output.records:
            if out.topic == self._topics.receipts:
                receipt = self._decode(out.value, Receipt)
                if receipt is not None:
                    kind, _, reason = receipt.disposition.partition(":")
                    pending.dispositions[(kind, reason)] += 1
            elif out.topic == self._topics.outbox:
                pending.dispatches += 1
            elif out.topic == self._topics.events:
                event = self._decode(out.value, ThreadEvent)
                if event is not None and event.kind in _PARK_KINDS:
                    pending.touched.add(event.thread_id)
        return output

    def commit(self, offsets: StoredOffsets) -> None:
        self._task.commit(offsets)
        pending, self._pending = self._pending, _Pending()
        for (disposition, reason), count in pending.dispositions.items():
            self._metrics.inputs.labels(disposition, reason).inc(count)
        if pending.dispatches:
            self._metrics.dispatches.inc(pending.dispatches)
        if pending.touched:
            parked = self._parked.setdefault(self._task.partition, set())
            for thread in pending.touched:
                if _is_parked(self._task._store, thread):
                    parked.add(thread)
                else:
                    parked.discard(thread)
            self._set_parked()

    def abort(self) -> None:
        self._task.abort()
        self._pending = _Pending()

    def wipe(self) -> None:
        self._task.wipe()

    def close(self) -> None:
        self._task.close()
        self._parked.pop(self._task.partition, None)
        self._set_parked()

    def _set_parked(self) -> None:
        self._metrics.parked.set(sum(len(threads) for threads in list(self._parked.values())))

    def _decode(self, value: bytes | None, cls: type[T]) -> T | None:
        try:
            return self._codec.decode(None, value or b"", cls)
        except DecodeError:  # the processor wrote it: a record it cannot read back is not a metric's concern
            return None


def _is_parked(store: Store, thread_id: str) -> bool:
    state = load_state(store, thread_id)
    return state is not None and state.status is Status.PARKED


class MeteredProcessor(Processor):
    """A `Processor` that counts into `metrics` (see the module docstring)."""

    def __init__(self, *args: object, metrics: ProcessorMetrics | None = None, **kwargs: object) -> None:
        self.metrics = metrics or ProcessorMetrics()
        self._parked: dict[int, set[str]] = {}
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.loop.commit_checkpoint = self._timed(self.loop.commit_checkpoint)  # type: ignore[method-assign,assignment]
        # The stages take the sink when their partition starts, after this: they get the counting one.
        self.sink = _CountingSink(self.sink, self.metrics)  # type: ignore[assignment]

    def _open_task(self, partition: int) -> MeteredTask:  # type: ignore[override]
        return MeteredTask(super()._open_task(partition), self.metrics, self.codec, self.topics, self._parked)

    def _timed(self, commit: Callable[[Deadline], bool]) -> Callable[[Deadline], bool]:
        loop = self.loop

        def timed(deadline: Deadline) -> bool:
            before = (loop.commits, loop.aborts)
            started = time.perf_counter()
            committed = commit(deadline)
            took = time.perf_counter() - started
            if (loop.commits, loop.aborts) != before:  # nothing was open: nothing to time
                outcome = "committed" if committed else "aborted"
                self.metrics.commit_seconds.labels(outcome).observe(took)
                self.metrics.checkpoints.labels(outcome).inc()
            return committed

        return timed


class _CountingSink:
    """The stage's sink, counting each completion it publishes (ok, or an error completion)."""

    def __init__(self, sink: StageSink, metrics: ProcessorMetrics) -> None:
        self._sink = sink
        self._metrics = metrics

    def publish_event(self, event: ThreadEvent) -> None:
        self._sink.publish_event(event)

    def publish_completion(self, completion: Input) -> None:
        self._sink.publish_completion(completion)
        body = completion.body
        failed = isinstance(body, Completion) and body.error is not None
        self._metrics.completions.labels("error" if failed else "ok").inc()


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
    """Serve `registry` on http://host:port/metrics from a daemon thread; returns the server
    (`server_port` is the port, when `port` is 0) and its thread. Raises `ConfigError` if it
    cannot listen there."""
    try:
        return start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {error}") from None
