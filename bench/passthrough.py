"""The raw limit: consume read_committed, produce transactionally, no fold and no store.

Contract. `run(settings, source, plan, ...)` consumes `source` with Torpor's consumer
settings (`make_consumer`) and, per input record, produces the output records `plan`
assigns to it (topic, key length, value length) with Torpor's transactional producer
(`make_producer`), keyed like the input so they land on the input's partition, and
commits the consumed offsets inside the transaction every `commit_interval` seconds or
`commit_every` records (the processor's pacing, `ProcessorConfig`). It returns the
seconds from the first record consumed to the last commit, once `expected` records
were processed. `apportion` spreads a run's output records evenly over its inputs, so
counts and sizes per topic equal the real processor's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Final

from torpor.streams.clients import make_consumer, make_producer
from torpor.streams.config import Settings

Output = tuple[str, int, int]  # topic, key bytes, value bytes
TIMEOUT_S: Final = 600.0


def apportion(outputs_by_topic: dict[str, list[tuple[int, int]]], inputs: int) -> list[list[Output]]:
    """Interleave each topic's records by relative position, then cut into `inputs` shares."""
    placed: list[tuple[float, Output]] = []
    for topic, sizes in outputs_by_topic.items():
        n = len(sizes)
        placed.extend(((j + 0.5) / n, (topic, k, v)) for j, (k, v) in enumerate(sizes))
    placed.sort(key=lambda item: item[0])
    flat = [output for _, output in placed]
    shares: list[list[Output]] = []
    for i in range(inputs):
        shares.append(flat[i * len(flat) // inputs : (i + 1) * len(flat) // inputs])
    return shares


def run(
    settings: Settings,
    source: str,
    plan: Sequence[Sequence[Output]],
    *,
    commit_interval: float,
    commit_every: int,
) -> float:
    expected = len(plan)
    consumer = make_consumer(settings, f"bench-pt-{uuid.uuid4().hex[:8]}")
    producer = make_producer(settings, transactional_id=f"bench-pt-{uuid.uuid4().hex[:8]}")
    payloads: dict[int, bytes] = {}

    def payload(size: int) -> bytes:
        found = payloads.get(size)
        if found is None:
            found = payloads[size] = b"x" * size
        return found

    try:
        producer.init_transactions(60)
        consumer.subscribe([source])
        producer.begin_transaction()
        done, uncommitted = 0, 0
        started: float | None = None
        last_commit = time.monotonic()
        deadline = time.monotonic() + TIMEOUT_S
        while done < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"pass-through processed {done} of {expected} records")
            for message in consumer.consume(500, timeout=0.05):
                if message.error() is not None or done >= expected:
                    continue
                if started is None:
                    started = time.monotonic()
                key, partition = message.key() or b"", message.partition()
                assert partition is not None  # a consumed record has one; the stub allows None
                for topic, key_len, value_len in plan[done]:
                    producer.produce(
                        topic,
                        key=key[:key_len] if key_len <= len(key) else payload(key_len),
                        value=payload(value_len),
                        partition=partition,
                    )
                producer.poll(0)
                done += 1
                uncommitted += 1
            if uncommitted and (
                uncommitted >= commit_every
                or time.monotonic() - last_commit >= commit_interval
                or done >= expected
            ):
                producer.send_offsets_to_transaction(
                    consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
                )
                producer.commit_transaction(60)
                producer.begin_transaction()
                uncommitted, last_commit = 0, time.monotonic()
        producer.abort_transaction(30)  # the empty transaction begun after the last commit
        return time.monotonic() - (started or time.monotonic())
    finally:
        consumer.close()
