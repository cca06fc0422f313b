"""Replay timing: `torpor replay` over an `inputs` log of N threads.

Contract. `python -m bench.replay [--threads 2000] [--turns 2] [--partitions 6]`
folds N threads with `bench.restore.generate` (the processor's `step`), produces their
inputs (in fold order, to the partition the processor would use) to a fresh `inputs`
topic and the fold's store changes to its changelog, under a prefix of its own on the
broker (TORPOR_BOOTSTRAP, or .torpor/BOOTSTRAP). Then it times

1. the library: `read_log` + `Replayer` (read_committed from the start, every input
   folded with `step` and the processor's default verifier), printed as inputs/s;
2. the command, `torpor replay --no-progress --json`, end to end as a process (reading
   and folding the log, reading the changelog, comparing every thread's head), which
   must exit 0 with no mismatch.

Then it deletes its topics.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Final

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from bench.restore import REPO, bootstrap, create_topic, generate, produce_changes
from torpor.processors.fold.verify import SourceVerifier
from torpor.processors.replay import Replayer, read_log, thread_heads
from torpor.processors.store.kv import Store
from torpor.schemas.codec import Codec, encode_value
from torpor.schemas.records import Input
from torpor.streams.config import DEFAULT_MAX_INPUT_BYTES

TORPOR: Final = str(Path(sys.executable).with_name("torpor"))


def produce_inputs(servers: str, topic: str, inputs: dict[int, list[Input]]) -> int:
    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 20})
    count = 0
    for partition, records in inputs.items():
        for record in records:
            value = encode_value(record)
            key = record.thread_id.encode()
            while True:
                try:
                    producer.produce(topic, key=key, value=value, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.05)
            count += 1
    assert producer.flush(120) == 0
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2_000)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args()
    servers = bootstrap()
    generated = generate(args.threads, args.turns, args.partitions)
    prefix = f"bench.replay.{uuid.uuid4().hex[:8]}."
    admin = AdminClient({"bootstrap.servers": servers})
    create_topic(admin, f"{prefix}inputs", args.partitions, compacted=False)
    create_topic(admin, f"{prefix}changelog", args.partitions, compacted=True)
    try:
        inputs = produce_inputs(servers, f"{prefix}inputs", generated.inputs)
        produce_changes(servers, f"{prefix}changelog", generated.changes)

        consumer = Consumer({"bootstrap.servers": servers, "group.id": f"bench-replay-{uuid.uuid4().hex}",
                             "isolation.level": "read_committed", "enable.auto.commit": False})
        replayer = Replayer(SourceVerifier(), Codec(), f"{prefix}inputs", DEFAULT_MAX_INPUT_BYTES)
        begin = time.perf_counter()
        for record in read_log(consumer, f"{prefix}inputs"):
            replayer.feed(record)
        stores = replayer.finish()
        library = time.perf_counter() - begin
        consumer.close()
        assert replayer.counts.folded == inputs, (replayer.counts, inputs)
        heads = thread_heads(dict[int, Store](stores))
        assert len(heads) == args.threads, len(heads)

        env = {**os.environ, "TORPOR_BOOTSTRAP": servers, "TORPOR_TOPIC_PREFIX": prefix,
               "TORPOR_PARTITIONS": str(args.partitions)}
        begin = time.perf_counter()
        result = subprocess.run([TORPOR, "replay", "--no-progress", "--json"], cwd=REPO, env=env,
                                capture_output=True, text=True, check=False)
        command = time.perf_counter() - begin
        report = json.loads(result.stdout or "{}")
        problem = result.stdout[-2000:] + result.stderr[-2000:]
        assert result.returncode == 0 and report.get("match") is True, problem
        print(f"threads={args.threads} inputs={inputs} library_seconds={library:.2f} "
              f"library_inputs_per_s={inputs / library:,.0f} command_seconds={command:.2f} "
              f"command_inputs_per_s={inputs / command:,.0f} (command includes start-up, the changelog "
              f"read and the comparison of {report['threads']} threads: all match)")
    finally:
        names = [f"{prefix}inputs", f"{prefix}changelog"]
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result(timeout=60)


if __name__ == "__main__":
    main()
