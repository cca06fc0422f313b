"""What the page's lag panel shows, computed from what the broker said: pure, no I/O.

Lag of an `inputs` partition is counted in offsets, from where the processor's group
resumes to the partition's end as a read_committed reader sees it (its last stable
offset, LSO):

- the group resumes at its committed offset; a partition it never committed resumes at
  its first retained offset (the processor's consumers reset to `earliest`), and so does
  one whose committed offset retention has since deleted;
- offsets are not records: a transaction's commit marker takes one, and so does every
  aborted record. The processor commits "one past the last record it folded", so a
  partition whose last offset is a marker (loopback inputs are written in transactions)
  shows end = committed + 1 when it is caught up. `lag_of` therefore takes what a read
  of a short gap found (`records_in_gap`): the sampler reads gaps of at most
  `PROBED_GAP` offsets and counts the records in them, so caught up shows 0. A longer
  gap is shown as its offset count, an upper bound (the sampler does not read a backlog
  to count it).

`LagHistory` is the bounded ring of samples the chart draws: per partition, the samples
of the last `WINDOW_MS`, never more than `MAX_SAMPLES`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

PROBED_GAP: Final = 16  # a gap this short is read to count its records (markers are not)
WINDOW_MS: Final = 10 * 60 * 1000  # what the chart can show: the last ten minutes
MAX_SAMPLES: Final = 600  # a bound however often samples come: one a second for the window


def resume_offset(committed: int | None, start: int) -> int:
    """Where the group reads `inputs` next: its committed offset, or the first retained one
    when it committed none or retention deleted what it committed."""
    return start if committed is None or committed < start else committed


def lag_of(committed: int | None, start: int, end: int, records_in_gap: int | None = None) -> int:
    """Inputs not yet folded and committed, per the module docstring.

    `start` and `end` are the partition's first retained offset and its last stable offset
    (an empty partition has start == end). `records_in_gap` is how many records a
    read_committed read of [resume, end) found, when one was made; it is the lag then.
    """
    gap = max(0, end - resume_offset(committed, start))
    if records_in_gap is None:
        return gap
    return max(0, min(gap, records_in_gap))


def is_probed(committed: int | None, start: int, end: int) -> bool:
    """Whether the sampler reads this partition's gap to count its records (a short, non-empty gap)."""
    return 0 < lag_of(committed, start, end) <= PROBED_GAP


@dataclass(frozen=True, slots=True)
class Member:
    """One processor instance: a member of the group, with the `inputs` partitions it owns."""

    member_id: str
    instance_id: str | None  # group.instance.id: the processor's `--instance` (static membership)
    client_id: str
    host: str
    partitions: tuple[int, ...]

    @property
    def name(self) -> str:
        """What the page calls it: the instance id, else the client id, else the member id."""
        return self.instance_id or self.client_id or self.member_id

    def as_json(self) -> dict[str, object]:
        return {"member_id": self.member_id, "instance_id": self.instance_id, "client_id": self.client_id,
                "host": self.host, "partitions": list(self.partitions), "name": self.name}


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One `inputs` partition as last sampled."""

    partition: int
    committed: int | None  # None: the group committed nothing here yet
    start: int
    end: int  # the last stable offset
    lag: int
    owner: str | None  # the member that owns it now (its name), None when unassigned

    def as_json(self) -> dict[str, object]:
        return {"partition": self.partition, "committed": self.committed, "start": self.start,
                "end": self.end, "lag": self.lag, "owner": self.owner}


def owners(members: Sequence[Member]) -> dict[int, str]:
    """Partition -> the name of the member it is assigned to."""
    return {partition: member.name for member in members for partition in member.partitions}


class LagHistory:
    """The last `window_ms` of lag samples per partition, at most `max_samples` each.

    Not thread-safe by itself: its one writer (the sampler) and its readers (requests)
    share it under the sampler's lock.
    """

    def __init__(self, window_ms: int = WINDOW_MS, max_samples: int = MAX_SAMPLES) -> None:
        if window_ms <= 0 or max_samples <= 0:
            raise ValueError("a lag history needs a positive window and sample count")
        self._window_ms = window_ms
        self._max = max_samples
        self._series: dict[int, deque[tuple[int, int]]] = {}

    def add(self, at_ms: int, lags: Mapping[int, int]) -> None:
        """Record each partition's lag at `at_ms`, and forget what is older than the window."""
        for partition, lag in lags.items():
            self._series.setdefault(partition, deque(maxlen=self._max)).append((at_ms, lag))
        for partition in list(self._series):
            samples = self._series[partition]
            while samples and samples[0][0] < at_ms - self._window_ms:
                samples.popleft()
            if not samples:
                del self._series[partition]  # a partition that went away (a recreated topic)

    def series(self, partition: int, since_ms: int | None = None) -> tuple[tuple[int, int], ...]:
        """(time in ms, lag) of `partition`, oldest first, from `since_ms` on when given."""
        samples = self._series.get(partition, ())
        return tuple(s for s in samples if since_ms is None or s[0] >= since_ms)

    @property
    def partitions(self) -> tuple[int, ...]:
        return tuple(sorted(self._series))
