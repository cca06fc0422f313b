"""Restore timing: an empty RocksDB store rebuilt from a changelog of N threads.

Contract. `python -m bench.restore [--threads 10000] [--turns 2] [--partitions 6]`
builds N threads with `torpor.processors.step.step` (the processor's own fold: each
thread is created, then gets `turns` user texts of about 110 characters, each answered
by a completion of about 1.1 KB, so 2*turns history entries), produces every store
change in fold order to a fresh compacted changelog topic on the broker
(TORPOR_BOOTSTRAP, or the address in .torpor/BOOTSTRAP), one partition per thread as
the processor writes it, then times `torpor.streams.restore.restore_partitions` (the
processor's restore code) into empty `RocksStore`s. It prints one line of figures:
threads, changelog records and bytes, seconds, records/s, MB/s; it checks that every
restored thread has its full history and deletes its topic.

`generate(threads, turns, partitions)` is shared with `bench/replay.py`: the inputs of
every partition in order, and the changelog records the fold produced for them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from torpor.processors.restoring import RocksTarget
from torpor.processors.step import StepRecord, step
from torpor.processors.store.kv import MemoryStore
from torpor.processors.store.tables import load_state
from torpor.processors.storedirs import partition_dir
from torpor.schemas.records import (
    Budgets,
    Capability,
    Completion,
    CreateThread,
    Input,
    InputBody,
    TextBlock,
    ThreadConfig,
    Usage,
    UserMessage,
)
from torpor.streams.config import consumer_config, load_settings
from torpor.streams.deadline import Deadline
from torpor.streams.partitioner import partition_for
from torpor.streams.restore import restore_partitions
from torpor.streams.task import Change

REPO: Final = Path(__file__).resolve().parents[1]
ANSWER: Final = ("The affected tests were re-run; the failures are in the parser and the scheduler "
                 "modules, and each is listed below with its cause. ") * 8  # about 1.1 KB
CONFIG: Final = ThreadConfig(
    model="scripted", system_prompt="You are a build agent.", tools=(),
    capability=Capability(tenant="bench", tools=(), scopes=("bench",), expires_at=None),
    budgets=Budgets(max_turns=None, max_children=None, max_tool_retries=2, max_invalid_calls=3),
    parent=None, context_window=0, compaction_threshold=0.8, allow_implicit_create=False,
)


def bootstrap() -> str:
    found = os.environ.get("TORPOR_BOOTSTRAP") or os.environ.get("TORPOR_TEST_BOOTSTRAP")
    return found or (REPO / ".torpor" / "BOOTSTRAP").read_text().strip()


def _input(thread_id: str, message_id: str, at: int, body: InputBody, source: str = "user:bench") -> Input:
    return Input(message_id=message_id, thread_id=thread_id, created_at=at, source=source,
                 expires_at=None, key_id=None, signature=None, body=body)


@dataclass
class Generated:
    """Per partition: the inputs in log order and the changelog records the fold wrote."""

    inputs: dict[int, list[Input]] = field(default_factory=dict)
    changes: dict[int, list[Change]] = field(default_factory=dict)
    stores: dict[int, MemoryStore] = field(default_factory=dict)


def generate(threads: int, turns: int, partitions: int) -> Generated:
    """Fold N threads with `step` (module docstring); completions answer each request."""
    out = Generated()
    ids = [f"bench-{i:06d}" for i in range(threads)]
    for p in range(partitions):
        out.inputs[p], out.changes[p], out.stores[p] = [], [], MemoryStore()

    def fold(partition: int, records: Sequence[Input]) -> list[Input]:
        store = out.stores[partition]
        result = step(store, [StepRecord(r, partition, len(out.inputs[partition]) + i)
                              for i, r in enumerate(records)])
        out.inputs[partition].extend(records)
        out.changes[partition].extend(result.changes)
        return [_input(c.thread_id, c.request_id, c.created_at + 1, Completion(
            c.request_id, (TextBlock(ANSWER),), (), Usage(400, 280, 680), c.model, None),
            source="processor") for c in result.completions]

    by_partition: dict[int, list[str]] = {p: [] for p in range(partitions)}
    for thread_id in ids:
        by_partition[partition_for(thread_id.encode(), partitions)].append(thread_id)
    for partition, mine in by_partition.items():
        fold(partition, [_input(t, f"{t}-create", 1_000, CreateThread(CONFIG, (), ())) for t in mine])
        for turn in range(turns):
            texts = [_input(t, f"{t}-text-{turn}", 2_000 + 10 * turn, UserMessage((TextBlock(
                f"Turn {turn}: re-run the affected tests for {t} and summarize any failures "
                "with their modules."),))) for t in mine]
            completions = fold(partition, texts)
            assert len(completions) == len(mine), "every text asks for one completion"
            fold(partition, completions)
    return out


def create_topic(admin: AdminClient, name: str, partitions: int, compacted: bool) -> None:
    config = {"cleanup.policy": "compact"} if compacted else {}
    for future in admin.create_topics([NewTopic(name, partitions, 1, config=config)]).values():
        future.result(timeout=60)


def produce_changes(servers: str, topic: str, changes: dict[int, list[Change]]) -> tuple[int, int]:
    """Produce the changelog records to their partitions; return (records, bytes)."""
    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 20,
                         "compression.type": "lz4"})
    count = size = 0
    for partition, rows in changes.items():
        for key, value in rows:
            while True:
                try:
                    producer.produce(topic, key=key, value=value, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.05)
            count += 1
            size += len(key) + len(value or b"")
    assert producer.flush(120) == 0
    return count, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args()
    servers = bootstrap()
    started = time.perf_counter()
    generated = generate(args.threads, args.turns, args.partitions)
    built = time.perf_counter() - started
    admin = AdminClient({"bootstrap.servers": servers})
    topic = f"bench.restore.{uuid.uuid4().hex[:8]}.changelog"
    create_topic(admin, topic, args.partitions, compacted=True)
    scratch = Path(tempfile.mkdtemp(prefix="torpor-restore-"))
    try:
        records, size = produce_changes(servers, topic, generated.changes)
        # The processor's consumer settings (`consumer_config`: read_committed, the
        # `[memory]` prefetch bound, TORPOR_* variables applied), as its restore has them.
        settings = load_settings({**os.environ, "TORPOR_BOOTSTRAP": servers}, None)
        consumer = Consumer(consumer_config(settings, f"bench-restore-{uuid.uuid4().hex}"))
        targets = {p: RocksTarget(partition_dir(scratch, p)) for p in range(args.partitions)}
        begin = time.perf_counter()
        results = restore_partitions(consumer, topic, targets, Deadline.after(600))
        seconds = time.perf_counter() - begin
        consumer.close()
        restored = sum(r.records for r in results.values())
        assert restored == records, f"restored {restored} of {records} records"
        for partition, target in targets.items():
            for key, _ in generated.stores[partition].iterate(b""):
                assert target.store.get(key) is not None, f"row {key!r} missing after restore"
        for thread_id in ("bench-000000", f"bench-{args.threads - 1:06d}"):
            target = targets[partition_for(thread_id.encode(), args.partitions)]
            state = load_state(target.store, thread_id)
            assert state is not None and state.history_len == 2 * args.turns
        for target in targets.values():
            target.store.close()
        print(f"threads={args.threads} history_entries={args.threads * 2 * args.turns} "
              f"changelog_records={records} changelog_bytes={size} restore_seconds={seconds:.2f} "
              f"records_per_s={records / seconds:,.0f} mb_per_s={size / seconds / 1e6:.1f} "
              f"(fold to build: {built:.1f}s)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        for future in admin.delete_topics([topic], operation_timeout=30).values():
            future.result(timeout=60)


if __name__ == "__main__":
    main()
