"""Local mode: the same `step`, model stage and connectors over an in-process log.

Contract. `LocalRuntime` owns an `InProcessLog` with the Torpor topics, one store per
input partition (RocksDB in a temp directory by default, or memory) and one
`ModelStage` per partition. `run_until_idle()` loops, in phases, until nothing is left
to do (or a deadline passes):

1. step: for each partition, fold the unread inputs into an `Overlay` over its store;
2. commit: append the step's outputs to the log (outbox, loopback inputs, events,
   receipts, parked), then apply the overlay to the store in one batch with the input
   offset it reaches; only now is anything visible;
3. after the commit: hand the history the step appended to the stages' history cache
   (`HistoryCache.extend`), the completion requests to the model stage and the new outbox
   records to the connectors (`Connectors.submit`), which answer later through the log.

Idle means: no unread input, no model call in flight, no connector `busy` (a tool
running, a timer pending). A call waiting for a person's approval is idle.

The wall clock lives here, never in the fold: `now_ms()` stamps every input local mode
produces (user text, completions, tool results), and the fold reads time only from them.
This module does not import connectors (DESIGN section 9): `torpor.cli.local` composes
them and passes them in through the `Connectors` Protocol.

No changelog: in Kafka mode the changelog topic is the store's replica, what a processor
restores a partition from. Local mode's store is its own truth (it never restores), and
nothing read the in-memory copy: it cost each completion some eight records (a third of
the log's appends) and held every history row twice in memory for the life of a run.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol, TypeVar

from torpor.processors.fold.verify import Verifier
from torpor.processors.models.provider import ModelProvider
from torpor.processors.models.stage import ModelStage, StageConfig
from torpor.processors.step import StepOutput, StepRecord, step
from torpor.processors.store.kv import MemoryStore, Overlay, RocksStore, Store, StoreOffsets
from torpor.processors.store.tables import HistoryCache
from torpor.processors.storedirs import partition_dir
from torpor.schemas.records import Dispatch, Input, Receipt, ThreadConfig, ThreadEvent
from torpor.streams.log import InProcessLog, LogRecord, LogTopic
from torpor.streams.topics import Topic

log = logging.getLogger(__name__)

V = TypeVar("V")

PREFIX: Final = "torpor."
INVOKE: Final = "invoke"  # the dispatch kind that runs a call (connectors' constant: not importable here)
POLL_S: Final = 0.05
"""How long the loop waits for a wake-up when idle-but-busy (timers, tools): a backstop;
every append to `inputs` and every finished model call wakes it at once."""


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch: local mode's one clock."""
    return time.time_ns() // 1_000_000


COLLECTOR_THRESHOLDS: Final = (200_000, 10, 10)
"""Python's cyclic collector, for a process that runs a runtime. The defaults (700, 10, 10)
made it scan every live object (the caches, local mode's log) again and again, about 14%
of a local benchmark's time, while the fold's values (frozen dataclasses, tuples) hold no
cycles. At 20,000 a young collection still met a checkpoint's records alive (local mode's
log, the outputs not yet committed: ~38,000 objects, 20-35 ms each), about 8% of the CPU;
at 200,000 most of them are freed by their reference counts before a collection comes
(young collections 2.5 s -> 0.02 s of a 2,000 x 20 local run, bench/README.md)."""


def tune_collector() -> None:
    """Set `COLLECTOR_THRESHOLDS` for this process (its entry point calls this, once)."""
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


class Connectors(Protocol):
    """The tools local mode runs in process (composed by the command line)."""

    def submit(self, dispatch: Dispatch) -> None:
        """A committed dispatch, at least once."""
        ...

    def failed(self, dispatch: Dispatch, error: BaseException) -> None:
        """Answer `dispatch`'s call (an invoke) with the error result of a tool that raised."""
        ...

    @property
    def busy(self) -> int:
        """Work in progress that will produce an input by itself."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """Local mode's settings. Defaults: a throwaway RocksDB, one partition."""

    partitions: int = 1  # one is plenty on a laptop; more exercises the murmur2 routing
    store: str = "rocks"  # "rocks" (the processor's real store) or "memory"
    store_dir: Path | None = None  # None: a temp directory, removed on close (no write-ahead log)
    batch_size: int = 200  # inputs per step: one local "checkpoint"
    # Short backoffs: a local run should show a retry, not wait through one.
    stage: StageConfig = field(default_factory=lambda: StageConfig(backoff_initial_s=0.05, backoff_max_s=0.5))

    def __post_init__(self) -> None:
        if self.partitions < 1 or self.batch_size < 1:
            raise ValueError("local mode needs partitions >= 1 and batch_size >= 1")
        if self.store not in ("rocks", "memory"):
            raise ValueError(f"store must be 'rocks' or 'memory', not {self.store!r}")


@dataclass(frozen=True, slots=True)
class Topics:
    """The local topics (names as in Kafka mode, `torpor.` prefix)."""

    inputs: LogTopic[Input]
    outbox: LogTopic[Dispatch]
    events: LogTopic[ThreadEvent]
    receipts: LogTopic[Receipt]
    parked: LogTopic[Input]

    @classmethod
    def with_partitions(cls, n: int) -> Topics:
        return cls(
            inputs=LogTopic(PREFIX + Topic.INPUTS, n),
            outbox=LogTopic(PREFIX + Topic.OUTBOX, n),
            events=LogTopic(PREFIX + Topic.EVENTS, n),
            receipts=LogTopic(PREFIX + Topic.RECEIPTS, n),
            parked=LogTopic(PREFIX + Topic.PARKED, n),
        )


Observer = Callable[[LogRecord[object]], None]


class LocalRuntime:
    """One process running threads end to end. See the module docstring."""

    def __init__(
        self,
        provider: ModelProvider,
        connectors: Connectors,
        config: LocalConfig | None = None,
        *,
        default_config: ThreadConfig | None = None,
        verifier: Verifier | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.config = config or LocalConfig()
        self.clock = clock
        self.log = InProcessLog()
        self.topics = Topics.with_partitions(self.config.partitions)
        self.connectors = connectors
        self.observers: list[Observer] = []
        self.steps = 0
        self.folded = 0
        self._default_config = default_config
        self._verifier = verifier
        self._provider = provider
        self._temp_dir: Path | None = None
        self.stores: list[Store] = [self._open_store(p) for p in range(self.config.partitions)]
        self._positions = [0] * self.config.partitions  # next input offset to fold
        self._outbox_positions = [0] * self.config.partitions  # next dispatch to hand out
        self._stages: list[ModelStage] | None = None
        self._histories: HistoryCache | None = None
        self._wake: asyncio.Event | None = None

    def _open_store(self, partition: int) -> Store:
        if self.config.store == "memory":
            return MemoryStore()
        base = self.config.store_dir
        if base is None:
            self._temp_dir = self._temp_dir or Path(tempfile.mkdtemp(prefix="torpor-local-"))
            # Removed on close and never opened again: no write-ahead log (`RocksStore`).
            return RocksStore(partition_dir(self._temp_dir, partition), wal=False)
        return RocksStore(partition_dir(base, partition))

    @property
    def store_root(self) -> Path | None:
        """The directory holding the stores' partitions (None: stores in memory)."""
        if self.config.store == "memory":
            return None
        return self.config.store_dir or self._temp_dir

    # --- producing -----------------------------------------------------------------

    def send(self, record: Input) -> LogRecord[Input]:
        """Produce an input (user text, an operator command, a tool's answer)."""
        placed = self.log.append(self.topics.inputs, record.thread_id, record)
        self._notify(placed)
        if self._wake is not None:
            self._wake.set()
        return placed

    def publish_event(self, event: ThreadEvent) -> None:
        """The model stage's live events (StageSink)."""
        self._publish(self.topics.events, event.thread_id, event)

    def publish_completion(self, completion: Input) -> None:
        """The model stage's finished completions (StageSink)."""
        self.send(completion)

    def _publish(self, topic: LogTopic[V], key: str, value: V) -> LogRecord[V]:
        placed = self.log.append(topic, key, value)
        self._notify(placed)
        return placed

    def _notify(self, record: LogRecord[object]) -> None:
        for observer in self.observers:
            observer(record)

    # --- the loop ------------------------------------------------------------------

    def _ensure_started(self) -> list[ModelStage]:
        if self._stages is None:
            self._wake = asyncio.Event()
            histories = HistoryCache(self.config.stage.history_cache_entries)  # one for all partitions
            self._histories = histories
            self._stages = [
                ModelStage(store, self._provider, self, self.clock, self.config.stage, histories)
                for store in self.stores
            ]
            for stage in self._stages:
                stage.resume()  # threads left awaiting the model by an earlier run
        return self._stages

    @property
    def history_cache(self) -> HistoryCache | None:
        """The stages' history cache (None until the loop starts): for metrics and tests."""
        return self._histories

    def is_idle(self) -> bool:
        stages = self._ensure_started()
        unread = any(
            self.log.end_offset(self.topics.inputs, p) > self._positions[p]
            for p in range(self.config.partitions)
        )
        return not unread and not any(s.in_flight for s in stages) and not self.connectors.busy

    async def run_until_idle(self, timeout_s: float = 30.0) -> None:
        """Fold, commit and serve until idle. Raises `TimeoutError` after `timeout_s`."""
        stages = self._ensure_started()
        assert self._wake is not None
        deadline = time.monotonic() + timeout_s
        while True:
            progressed = self.run_once()
            if self.is_idle():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"local mode still busy after {timeout_s}s")
            if not progressed:
                self._wake.clear()
                waits: list[asyncio.Future[object]] = [asyncio.ensure_future(self._wake.wait())]
                waits.extend(asyncio.ensure_future(s.wait_idle()) for s in stages if s.in_flight)
                _, pending = await asyncio.wait(waits, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
                for task in pending:
                    task.cancel()
            else:
                await asyncio.sleep(0)  # let the stage and connectors run between checkpoints

    def run_once(self) -> bool:
        """One checkpoint per partition with unread inputs; True if anything was folded."""
        stages = self._ensure_started()
        progressed = False
        for partition in range(self.config.partitions):
            batch = self.log.read(
                self.topics.inputs, partition, self._positions[partition], self.config.batch_size
            )
            if not batch:
                continue
            progressed = True
            records = [StepRecord(r.value, r.partition, r.offset) for r in batch]
            overlay = Overlay(self.stores[partition])
            output = step(overlay, records, verifier=self._verifier, default_config=self._default_config)
            self._commit(partition, overlay, output, next_offset=batch[-1].offset + 1)
            if self._histories is not None:  # committed: the stage need not read these rows back
                for appended in output.appended:
                    self._histories.extend(appended)
            for request in output.completions:
                stages[partition].submit(request)
        self._hand_out_dispatches()
        return progressed

    def _commit(self, partition: int, overlay: Overlay, output: StepOutput, next_offset: int) -> None:
        """Phase 2: the outputs become visible, then the store catches up in one batch."""
        # A topic's records in one append: one lock for them all (`Log.append_all`).
        outbox = self.log.append_all(self.topics.outbox, [(d.thread_id, d) for d in output.dispatches])
        events = self.log.append_all(self.topics.events, [(e.thread_id, e) for e in output.events])
        receipts = self.log.append_all(self.topics.receipts, [(r.thread_id, r) for r in output.receipts])
        if self.observers:
            for records in (outbox, events, receipts):
                for record in records:
                    self._notify(record)
        for parked in output.parked:
            self.log.append(self.topics.parked, parked.record.input.thread_id, parked.record.input)
        for loopback in output.loopbacks:
            self.send(loopback)
        overlay.commit(StoreOffsets(input_offset=next_offset))
        self._positions[partition] = next_offset
        self.steps += 1
        self.folded += len(output.receipts)

    def _hand_out_dispatches(self) -> None:
        """Phase 3: connectors see only dispatches of committed steps."""
        for partition in range(self.config.partitions):
            fresh = self.log.read(self.topics.outbox, partition, self._outbox_positions[partition])
            self._outbox_positions[partition] += len(fresh)
            for record in fresh:
                self._hand_over(record.value)

    def _hand_over(self, dispatch: Dispatch) -> None:
        """`submit`; a tool that raises has its call answered with its error, and the other
        dispatches are still handed out (their outbox position has moved past them).
        KeyboardInterrupt and SystemExit propagate; a CancelledError here is the tool's
        (this loop never awaits in between)."""
        try:
            self.connectors.submit(dispatch)
        except (Exception, asyncio.CancelledError) as error:
            where = {"thread_id": dispatch.thread_id, "request_id": dispatch.request_id}
            log.error("tool %s raised when handed its %s dispatch", dispatch.tool, dispatch.kind,
                      exc_info=error, extra=where)
            if dispatch.kind == INVOKE:  # a cancel's or close's call was answered by the fold
                self.connectors.failed(dispatch, error)

    async def close(self) -> None:
        """Stop model calls and connectors, close the stores, remove a temp directory."""
        if self._stages is not None:
            for stage in self._stages:
                await stage.cancel()
        await self.connectors.close()
        for store in self.stores:
            if isinstance(store, RocksStore):
                store.close()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)

    def inputs(self) -> Sequence[LogRecord[Input]]:
        """Every input produced so far (the source of truth, for replays and transcripts)."""
        return self.log.read_all(self.topics.inputs)
