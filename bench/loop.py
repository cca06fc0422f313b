"""`python -m bench.loop`: the checkpoint loop's own cost per input, without the fold or a store.

Contract. Creates topics of its own (`bench-loop.<random>.`), fills `inputs` with
`--inputs` records (780 bytes, 1,000 keys), and runs one `streams.loop.CheckpointLoop`
over them until idle, with a task that folds nothing and stores nothing: per input it
returns the records the processor writes per input in `bench.kafka` (a receipt, 2.3
events, 0.3 outbox records and 3.5 store changes, of those sizes), so what is measured
is the loop's consuming, producing, delivery reports and commits. Prints the process's
CPU time (librdkafka's threads included) per input and the wall time, then deletes its
topics. `--librdkafka KEY=VALUE` sets a client property; `--commit-every` bounds the
inputs per transaction (the bench's processor commits ~300 a time). CPU per input
moves much less with the machine's load than `bench.kafka`'s rate: compare loop
changes with this, back to back.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence
from typing import Final

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from bench.measure import cpu_seconds
from bench.topics import create_topics, delete_topics, produce_queued
from torpor.streams.clients import make_consumer, make_producer
from torpor.streams.config import KafkaSettings, Settings
from torpor.streams.loop import CheckpointLoop, LoopSettings
from torpor.streams.task import Change, InputRecord, OutputRecord, StoredOffsets, TaskOutput

TOPICS: Final = ("inputs", "changelog", "outbox", "events", "receipts")
INPUT_VALUE: Final = b"x" * 780
RECEIPT: Final = b"r" * 300
EVENT: Final = b"e" * 600
DISPATCH: Final = b"o" * 185
STATE: Final = b"s" * 540


class OutputsOnly:
    """A `PartitionTask` that returns the bench processor's records per input, and keeps nothing."""

    def __init__(self, names: dict[str, str]) -> None:
        self._names = names
        self._folded = 0

    def offsets(self) -> StoredOffsets:
        return StoredOffsets(None, None)

    def restore(self, changes: Sequence[Change], offsets: StoredOffsets) -> None:
        pass

    def start(self) -> None:
        pass

    def process(self, records: Sequence[InputRecord]) -> TaskOutput:
        n = self._names
        out: list[OutputRecord] = []
        changes: list[Change] = []
        for record in records:
            self._folded += 1
            key = record.key or b""
            where = str(record.offset).encode()
            out.append(OutputRecord(n["receipts"], key, RECEIPT))
            out.append(OutputRecord(n["events"], key, EVENT))
            out.append(OutputRecord(n["events"], key, EVENT))
            if self._folded % 3 == 0:
                out.append(OutputRecord(n["events"], key, EVENT))
                out.append(OutputRecord(n["outbox"], key, DISPATCH))
            changes.extend(((key + b"M" + where, b"1"), (key + b"S", STATE), (key + b"H" + where, STATE)))
            if self._folded % 2:
                changes.append((key + b"W", STATE))
        return TaskOutput(tuple(out), tuple(changes))

    def commit(self, offsets: StoredOffsets) -> None:
        pass

    def abort(self) -> None:
        pass

    def wipe(self) -> None:
        pass

    def close(self) -> None:
        pass


def fill(bootstrap: str, topic: str, inputs: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "partitioner": "murmur2_random"})
    for i in range(inputs):
        produce_queued(producer, topic, f"agent-{i % 1000}".encode(), INPUT_VALUE)
    producer.flush(120)


def _property(text: str) -> tuple[str, str]:
    key, _, value = text.partition("=")
    return key, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--inputs", type=int, default=60_000)
    parser.add_argument("--commit-every", type=int, default=300)
    parser.add_argument("--librdkafka", action="append", default=[], metavar="KEY=VALUE",
                        help="A librdkafka property for the loop's clients (as [kafka.librdkafka]).")
    args = parser.parse_args()
    prefix = f"bench-loop.{uuid.uuid4().hex[:10]}."
    names = {t: prefix + t for t in TOPICS}
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    create_topics(admin, list(names.values()), 3)
    try:
        fill(args.bootstrap, names["inputs"], args.inputs)
        overrides = tuple(_property(text) for text in args.librdkafka)
        kafka = KafkaSettings(bootstrap_servers=args.bootstrap, librdkafka_overrides=overrides)
        settings = Settings(kafka=kafka)
        group = prefix + "group"
        loop = CheckpointLoop(
            make_consumer(settings, group, instance_id="i0"),
            make_producer(settings, transactional_id=f"{group}-i0"),
            make_consumer(settings, f"{group}.restore"),
            lambda partition: OutputsOnly(names),
            LoopSettings(names["inputs"], names["changelog"], commit_every=args.commit_every),
        )
        wall, cpu = time.perf_counter(), cpu_seconds()
        loop.run(lambda: False, until_idle=True)
        cpu, wall = cpu_seconds() - cpu, time.perf_counter() - wall
        loop.close()
        print(f"loop: {args.inputs} inputs, {loop.commits} commits in {wall:.2f}s; CPU {cpu:.2f}s = "
              f"{cpu / args.inputs * 1e6:.1f} us per input")
    finally:
        delete_topics(admin, list(names.values()))


if __name__ == "__main__":
    main()
