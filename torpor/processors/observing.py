"""What a Kafka processor tells an observer: `ProcessorObserver`, and `CommittedWork`.

Contract. `Processor(..., observer=...)` hands one observer to the three places that
know something worth counting, each of which passes what it already holds (nothing is
decoded again, nothing reaches into private state):

- the checkpoint loop (`streams.checkpoints.CheckpointObserver`): each checkpoint's
  commit latency, and each abort with its cause;
- each partition's `ThreadTask`, on the loop's thread:
      partition_started(partition, store, input_offset)   restored and checked: folding begins
      partition_committed(work, store)                    a checkpoint committed this
                                                          partition's `CommittedWork`; `store`
                                                          holds it already
      partition_closed(partition)                         revoked, lost or shut down
  A checkpoint that aborts tells the task nothing to count: what it folded is dropped
  with the overlay, and folded again later. So whatever counts `CommittedWork` counts
  each input exactly once, as the `receipts` topic holds it.
- the model stage (`models.stage.CompletionObserver`), on the stage's thread: each
  completion it published, with its model, its latency and its usage.

Observers must be quick, thread-safe (two threads call them) and must not raise.
`torpor.processors.metrics.ProcessorMetrics` is the implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torpor.processors.models.stage import CompletionObserver
from torpor.processors.step import StepOutput
from torpor.processors.store.kv import RocksStore
from torpor.streams.checkpoints import CheckpointObserver


@dataclass(frozen=True, slots=True)
class CommittedWork:
    """What one partition's share of a committed checkpoint held.

    `steps`: the outputs of every `step` the checkpoint ran on the partition, in order
    (their receipts, one per input, are what the `receipts` topic now holds). `poisoned`:
    records parked undecodable, each with one `parked` receipt of its own.
    `input_offset`: the next `inputs` offset to fold, as committed.
    """

    partition: int
    steps: tuple[StepOutput, ...]
    poisoned: int
    input_offset: int | None


class ProcessorObserver(CheckpointObserver, CompletionObserver, Protocol):
    """Told of every committed checkpoint, partition and completion (module docstring)."""

    def partition_started(self, partition: int, store: RocksStore, input_offset: int | None) -> None: ...

    def partition_committed(self, work: CommittedWork, store: RocksStore) -> None: ...

    def partition_closed(self, partition: int) -> None: ...
