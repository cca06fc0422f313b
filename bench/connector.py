"""`python -m bench.connector`: the connector alone, as bench.kafka runs it, on a fixed load.

Contract. With a topic prefix of its own, creates the `outbox`, `inputs` and `toolsets`
topics, starts one `torpor connector run bench.workload:BenchTool` (its journal in a
temporary directory), and produces `--calls` `run_command` dispatches to the outbox in
rounds of `--round`: each round waits until the connector has answered all of its calls
(the `inputs` high watermarks), as a wave's agents wait for their tool results. Prints
and returns the connector's CPU per call (psutil, start-up excluded), calls per second
and the rounds' mean latency. No processor runs: what is measured is the connector and
its journal (the broker's CPU is not counted).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Final

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.kafka import settle
from bench.measure import cpu_seconds
from bench.topics import create_topics, delete_topics, produce_queued
from bench.workload import ARGUMENTS, TOOL, agent_id
from torpor.schemas.codec import encode_value
from torpor.schemas.records import Capability, Dispatch
from torpor.streams.topics import Topic, TopicNames

REPO: Final = Path(__file__).resolve().parents[1]
TORPOR: Final = str(Path(sys.executable).with_name("torpor"))
ROUND_TIMEOUT_S: Final = 120.0
CAPABILITY: Final = Capability(tenant="bench", tools=(TOOL,), scopes=("bench",), expires_at=None)


def dispatch(index: int, run: str) -> Dispatch:
    thread = agent_id(index % 1000)
    return Dispatch(request_id=f"{run}:rq-{index}", thread_id=thread, call_id=f"call-{index}", tool=TOOL,
                    arguments=ARGUMENTS, capability=CAPABILITY, attempt=0, created_at=int(time.time() * 1000),
                    deadline=None, kind="invoke")


def answered(consumer: Consumer, topic: str, partitions: int) -> int:
    """Records on `topic` so far (0 while a new topic's leader is not known yet)."""
    try:
        ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                for p in range(partitions)]
    except KafkaException:
        return 0
    return sum(high for _, high in ends)


def run(bootstrap: str, calls: int, round_size: int, partitions: int) -> dict[str, float]:
    prefix = f"bench.{uuid.uuid4().hex[:8]}."
    names = TopicNames.for_prefix(prefix)
    topics = [names.of(Topic.OUTBOX), names.of(Topic.INPUTS), names.of(Topic.TOOLSETS)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topics(admin, topics, partitions)
    work = Path(tempfile.mkdtemp(prefix="bench-connector-"))
    env = {**os.environ, "TORPOR_BOOTSTRAP": bootstrap, "TORPOR_TOPIC_PREFIX": prefix,
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    with open(work / "connector.log", "wb") as log:
        connector = subprocess.Popen(
            [TORPOR, "connector", "run", "bench.workload:BenchTool", "--group", f"conn-{prefix}",
             "--journal-dir", str(work / "journal"), "--log-level", "warning"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "linger.ms": 5})
    watcher = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-watch-{prefix}"})
    run_id = uuid.uuid4().hex[:8]
    try:
        # A first call answered: the connector has found its topics and joined its group.
        produce_queued(producer, names.of(Topic.OUTBOX), b"warm", encode_value(dispatch(-1, run_id)))
        producer.flush(30)
        _wait(watcher, names.of(Topic.INPUTS), partitions, 1, connector)
        settle([connector.pid])
        cpu_started = cpu_seconds(connector.pid)
        started = time.perf_counter()
        latencies: list[float] = []
        for first in range(0, calls, round_size):
            round_started = time.perf_counter()
            for index in range(first, min(calls, first + round_size)):
                record = dispatch(index, run_id)
                produce_queued(producer, names.of(Topic.OUTBOX), record.thread_id.encode(),
                               encode_value(record))
            producer.flush(30)
            _wait(watcher, names.of(Topic.INPUTS), partitions, 1 + min(calls, first + round_size), connector)
            latencies.append(time.perf_counter() - round_started)
        seconds = time.perf_counter() - started
        cpu = cpu_seconds(connector.pid) - cpu_started
    finally:
        connector.terminate()
        connector.wait(30)
        watcher.close()
        delete_topics(admin, topics)
        shutil.rmtree(work, ignore_errors=True)
    result = {"calls": float(calls), "seconds": seconds, "calls_per_s": calls / seconds,
              "cpu_us_per_call": cpu / calls * 1e6, "round_ms": 1000 * sum(latencies) / len(latencies)}
    print(f"{calls} calls in rounds of {round_size}: {result['calls_per_s']:,.0f} calls/s, "
          f"{result['cpu_us_per_call']:.0f} us CPU per call, {result['round_ms']:.1f} ms per round",
          flush=True)
    return result


def _wait(watcher: Consumer, topic: str, partitions: int, count: int,
          connector: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while answered(watcher, topic, partitions) < count:
        if connector.poll() is not None:
            raise RuntimeError(f"the connector exited ({connector.returncode})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} answers not seen on {topic} within {ROUND_TIMEOUT_S:.0f}s")
        time.sleep(0.002)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--round", type=int, default=100,
                        help="calls produced together, all answered before the next round")
    parser.add_argument("--partitions", type=int, default=1)
    args = parser.parse_args()
    run(args.bootstrap, args.calls, args.round, args.partitions)


if __name__ == "__main__":
    main()
