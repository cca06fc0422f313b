"""Re-folding `inputs` into memory, up to a cut: what `torpor replay` and the inspector's
time travel share.

`refold(settings, cut, thread_id, at)` reads the `inputs` topic read_committed (all of
it, or one thread's partition and records) up to `cut` and folds it with the processor's
own `step`, verifier and size limit (`verifier_for(settings.inputs)`,
`settings.inputs.max_bytes`) into one `MemoryStore` per partition; with `thread_id` and
`at`, its partition stops after the input at offset `at` (inclusive). It produces
nothing. Raises `TorporError` (`RetriableError` when the topic is not there) when the
log cannot be read.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from torpor.processors.replay import Cut, Progress, Replayer, partitions_of, read_log
from torpor.processors.store.kv import MemoryStore
from torpor.processors.trust import verifier_for
from torpor.schemas.codec import Codec
from torpor.streams.clients import make_consumer
from torpor.streams.config import Settings
from torpor.streams.partitioner import partition_for
from torpor.streams.topics import TopicNames


@dataclass(frozen=True, slots=True)
class Refolded:
    """The stores by partition, the inputs parked unfolded (as the processor parks them), and
    the partition of the thread asked for (None without one)."""

    stores: dict[int, MemoryStore]
    parked: int
    partition: int | None


def refold(settings: Settings, cut: Cut | None = None, thread_id: str | None = None, at: int | None = None,
           progress: Progress | None = None) -> Refolded:
    cut = cut or Cut()
    verifier = verifier_for(settings.inputs)  # the processor's own: inputs judged as they were live
    topic = TopicNames.for_prefix(settings.topics.prefix).inputs
    consumer = make_consumer(settings, f"torpor-replay-{uuid.uuid4().hex[:8]}")
    try:
        count = len(partitions_of(consumer, topic))
        partition = None if thread_id is None else partition_for(thread_id.encode("utf-8"), count)
        if partition is not None and at is not None:
            cut = Cut({**cut.offsets, partition: at}, cut.until_ms)
        replayer = Replayer(verifier, Codec.from_url(settings.schema_registry.url), topic,
                            settings.inputs.max_bytes, partitions=count)
        chosen = None if partition is None else [partition]
        for record in read_log(consumer, topic, cut, thread_id, partitions=chosen, progress=progress):
            replayer.feed(record)
        return Refolded(dict(replayer.finish()), replayer.counts.parked, partition)
    finally:
        consumer.close()
