"""The lag sampler: one background thread that asks the broker how far the processor is behind.

Contract. `LagWatch(settings, group).start()` starts a daemon thread that, every
`SAMPLE_SECONDS`, reads for the processor's consumer group `group` (its `--app`):

1. the partitions of `inputs` (metadata);
2. each partition's first retained offset and its end, read_committed (the last stable
   offset), in batched admin requests, and the group's committed offsets, through a
   consumer of the group's that never joins it (`clients.make_offsets_reader`: the admin
   request for them can crash the process);
3. the group's members and the partitions each is assigned (describe the group);
4. for each short gap (`lag.is_probed`), the records really in it: a read_committed read
   from the committed offset to the end, so a commit marker is not counted as an input;

and publishes the result (`view()`) and adds it to the chart's `LagHistory`. Nothing runs
on the event loop: a request reads the last sample under a lock. When the broker is
away (or `inputs` does not exist yet), `view()` keeps the last sample and says why in
`error`; the failure is logged once, not per attempt, and sampling resumes by itself.
`stop()` ends the thread between samples and closes its clients.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

# The public names in confluent_kafka.admin are not re-exported for a type checker.
from confluent_kafka.admin._listoffsets import OffsetSpec

from torpor.inspector.lag import (
    LagHistory,
    Member,
    PartitionLag,
    is_probed,
    lag_of,
    owners,
    resume_offset,
)
from torpor.schemas.errors import TorporError
from torpor.streams.clients import make_admin, make_consumer, make_offsets_reader
from torpor.streams.config import Settings
from torpor.streams.errors import translate
from torpor.streams.topics import TopicNames

LOG = logging.getLogger(__name__)
SAMPLE_SECONDS: Final = 3.0
CALL_SECONDS: Final = 5.0  # one broker request; a sample makes four or five
PROBE_SECONDS: Final = 3.0  # reading the short gaps, all at once
JOIN_SECONDS: Final = 10.0


@dataclass(frozen=True, slots=True)
class LagView:
    """The last sample: the group, when it was taken, its partitions and members, and
    what kept the next one from being taken (None while sampling works)."""

    group: str
    at_ms: int | None  # None: no sample taken yet
    partitions: tuple[PartitionLag, ...]
    members: tuple[Member, ...]
    group_state: str
    error: str | None

    def as_json(self) -> dict[str, object]:
        return {"group": self.group, "at": self.at_ms, "group_state": self.group_state, "error": self.error,
                "partitions": [p.as_json() for p in self.partitions],
                "members": [m.as_json() for m in self.members],
                "total_lag": sum(p.lag for p in self.partitions)}


class LagWatch:
    def __init__(self, settings: Settings, group: str, *, every: float = SAMPLE_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self._settings = settings
        self._group = group
        self._every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torpor-ui-lag", daemon=True)
        self._view = LagView(group, None, (), (), "unknown", None)
        self.history = LagHistory()
        self.failures = 0  # samples failed in a row (0 while sampling works)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(JOIN_SECONDS)

    def view(self) -> LagView:
        with self._lock:
            return self._view

    def series(self, since_ms: int) -> dict[int, tuple[tuple[int, int], ...]]:
        """Each partition's samples since `since_ms`, oldest first."""
        with self._lock:
            return {p: self.history.series(p, since_ms) for p in self.history.partitions}

    def _run(self) -> None:
        admin: AdminClient | None = None
        consumer: Consumer | None = None
        offsets: Consumer | None = None
        failing = False  # logged once per outage: the page shows every failure's reason
        try:
            while not self._stop.is_set():
                try:
                    admin = admin or make_admin(self._settings)
                    # A consumer of no group's: it only assigns, never joins, never commits.
                    consumer = consumer or make_consumer(self._settings, f"torpor-ui-lag-{uuid.uuid4().hex}")
                    offsets = offsets or make_offsets_reader(self._settings, self._group)
                    for served in (consumer, offsets):
                        # Nothing else polls them: their log lines and errors would queue
                        # unseen for as long as an outage lasts. Unsubscribed, they join nothing.
                        served.poll(0)
                    self._publish(self._sample(admin, consumer, offsets))
                    if failing:
                        LOG.info("the inspector's lag sampler reaches the broker again")
                    failing = False
                    self.failures = 0
                except Exception as error:  # shown on the page; the sampler never dies of one sample
                    reason = _reason(error)
                    # A failed admin future keeps its exception, whose traceback holds the frames
                    # that hold the future and the client: a cycle only the garbage collector frees,
                    # and it may run on librdkafka's background thread (an admin callback), where
                    # destroying a client aborts the process. Cut it: the client then goes when
                    # this thread ends, on this thread.
                    error.__traceback__ = None
                    if not failing:  # once per outage, not every few seconds
                        LOG.warning("the inspector cannot read the processor's lag, retrying every "
                                    "%.0f s: %s", self._every, reason)
                    failing = True
                    self.failures += 1
                    with self._lock:
                        old = self._view
                        self._view = LagView(old.group, old.at_ms, old.partitions, old.members,
                                             old.group_state, reason)
                self._stop.wait(self._every)
        finally:
            for reader in (consumer, offsets):
                if reader is not None:
                    reader.close()

    def _publish(self, view: LagView) -> None:
        with self._lock:
            self._view = view
            if view.at_ms is not None:
                self.history.add(view.at_ms, {p.partition: p.lag for p in view.partitions})

    def _sample(self, admin: AdminClient, consumer: Consumer, offsets: Consumer) -> LagView:
        topic = TopicNames.for_prefix(self._settings.topics.prefix).inputs
        metadata = admin.list_topics(topic, timeout=CALL_SECONDS)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise _Unavailable(f"the inputs topic {topic} does not exist yet")
        tps = [TopicPartition(topic, p) for p in sorted(found.partitions)]
        starts = _offsets(admin, tps, OffsetSpec.earliest())  # type: ignore[no-untyped-call]  # untyped in the stub
        ends = _offsets(admin, tps, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        committed = _committed(offsets, tps)
        state, members = _members(admin, self._group, topic)
        numbers = [tp.partition for tp in tps]
        probed = {p: resume_offset(committed.get(p), starts[p])
                  for p in numbers if is_probed(committed.get(p), starts[p], ends[p])}
        counted = _records_in_gaps(consumer, topic, probed, ends) if probed else {}
        owned = owners(members)
        partitions = tuple(
            PartitionLag(p, committed.get(p), starts[p], ends[p],
                         lag_of(committed.get(p), starts[p], ends[p], counted.get(p)), owned.get(p))
            for p in numbers)
        return LagView(self._group, int(self._clock() * 1000), partitions, members, state, None)


class _Unavailable(TorporError):
    """What keeps a sample from being taken that is no Kafka error (no `inputs` yet)."""


def _reason(error: Exception) -> str:
    """One line for the page: what kept the sample from being taken (never a traceback)."""
    if isinstance(error, concurrent.futures.TimeoutError):
        return f"the broker did not answer within {CALL_SECONDS:.0f} s"
    if isinstance(error, KafkaException):
        return str(translate(error, operation="reading the processor's lag"))
    if isinstance(error, TorporError):
        return str(error)
    return f"{type(error).__name__}: {error}"  # unexpected: named, so it can be reported


def _offsets(admin: AdminClient, tps: Sequence[TopicPartition], spec: OffsetSpec) -> dict[int, int]:
    futures = admin.list_offsets({tp: spec for tp in tps}, isolation_level=IsolationLevel.READ_COMMITTED,
                                 request_timeout=CALL_SECONDS)
    return {tp.partition: future.result(timeout=CALL_SECONDS).offset for tp, future in futures.items()}


def _committed(offsets: Consumer, tps: Sequence[TopicPartition]) -> dict[int, int]:
    """The group's committed offset per partition; a partition without one is left out."""
    return {tp.partition: tp.offset for tp in offsets.committed(list(tps), timeout=CALL_SECONDS)
            if tp.offset >= 0 and tp.error is None}


def _members(admin: AdminClient, group: str, topic: str) -> tuple[str, tuple[Member, ...]]:
    (future,) = admin.describe_consumer_groups([group], request_timeout=CALL_SECONDS).values()
    try:
        described = future.result(timeout=CALL_SECONDS)
    except KafkaException as error:
        if error.args and isinstance(error.args[0], KafkaError) and \
                error.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
            return "none", ()  # no processor ever joined (a broker that says so instead of DEAD)
        raise
    members = tuple(sorted(
        (Member(m.member_id, m.group_instance_id, m.client_id, m.host,
                tuple(sorted(tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic)))
         for m in described.members),
        key=lambda m: (m.name, m.member_id)))
    state = described.state
    return (state.name.lower() if state is not None and hasattr(state, "name") else str(state)), members


def _records_in_gaps(consumer: Consumer, topic: str, resume: Mapping[int, int],
                     ends: Mapping[int, int]) -> dict[int, int]:
    """Records a read_committed read finds in [resume, end) of each partition. A partition
    the read did not finish in `PROBE_SECONDS` is left out (its offset gap is shown)."""
    found = dict.fromkeys(resume, 0)
    pending = set(resume)
    consumer.assign([TopicPartition(topic, p, offset) for p, offset in resume.items()])
    try:
        deadline = time.monotonic() + PROBE_SECONDS
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(100, timeout=0.2):
                partition = message.partition()
                offset = message.offset()
                if message.error() is None and partition in pending and offset is not None \
                        and offset < ends[partition]:
                    found[partition] += 1
            # The position moves past markers and aborted records, which consume() never returns.
            for position in consumer.position([TopicPartition(topic, p) for p in pending]):
                if position.offset >= ends[position.partition]:
                    pending.discard(position.partition)
    finally:
        consumer.unassign()
    return {p: n for p, n in found.items() if p not in pending}
