"""A test rig around `counter_task`: its topics, its processes, and the exactly-once checks.

`CounterRig` names one run's topics, group and store folder; `start` launches the counter
process (killable), `run_until_idle` runs it to completion, and the readers collect what
the transactions made visible (read_committed), so a test can assert that every input
value appears on `out` exactly once and every count equals its key's inputs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.streams.counter_task import POISON, read_counts
from tests.waiting import wait_until

REPO: Final = Path(__file__).resolve().parents[2]


_STARTED: Final[list[subprocess.Popen[bytes]]] = []


@dataclass(frozen=True, slots=True)
class CounterRig:
    bootstrap: str
    inputs: str
    changelog: str
    out: str
    parked: str
    group: str
    store: Path
    partitions: int

    def command(self, *, until_idle: bool, instance: str = "i0", commit_every: int = 1000,
                max_batch: int = 500, fetch_bytes: int | None = None,
                transaction_timeout: float | None = None, txn_timeout_ms: int | None = None,
                rejoin_wait: float | None = None, queue_messages: int | None = None,
                linger_ms: int | None = None) -> list[str]:
        args = [sys.executable, "-m", "tests.streams.counter_task", "--bootstrap", self.bootstrap,
                "--inputs", self.inputs, "--changelog", self.changelog, "--out", self.out,
                "--parked", self.parked, "--group", self.group, "--instance", instance,
                "--store", str(self.store), "--commit-every", str(commit_every),
                "--max-batch", str(max_batch)]
        if fetch_bytes is not None:
            args += ["--fetch-bytes", str(fetch_bytes)]
        if transaction_timeout is not None:
            args += ["--transaction-timeout", str(transaction_timeout)]
        if txn_timeout_ms is not None:
            args += ["--txn-timeout-ms", str(txn_timeout_ms)]
        if rejoin_wait is not None:
            args += ["--rejoin-wait", str(rejoin_wait)]
        if queue_messages is not None:
            args += ["--queue-messages", str(queue_messages)]
        if linger_ms is not None:
            args += ["--linger-ms", str(linger_ms)]
        return [*args, "--until-idle"] if until_idle else args

    def start(self, *, until_idle: bool = False, env: Mapping[str, str] | None = None,
              log_name: str = "counter", **options: int | float | str) -> subprocess.Popen[bytes]:
        log = open(self.store.parent / f"{log_name}-{uuid.uuid4().hex[:6]}.log", "wb")  # noqa: SIM115
        process = subprocess.Popen(
            self.command(until_idle=until_idle, **options),  # type: ignore[arg-type]
            cwd=REPO, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
        )
        _STARTED.append(process)
        return process

    def kill_all(self) -> None:
        """SIGKILL every process `start` launched that still runs (each by its own pid)."""
        while _STARTED:
            process = _STARTED.pop()
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait(timeout=30)

    def run_until_idle(self, *, env: Mapping[str, str] | None = None, timeout: float = 120.0,
                       **options: int | str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(until_idle=True, **options),  # type: ignore[arg-type]
            cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True,
            timeout=timeout, check=False,
        )

    def produce_inputs(self, count: int, *, keys: int = 10, poison_every: int | None = None,
                       first: int = 0) -> list[tuple[bytes, bytes]]:
        """Produce `count` inputs `k<i % keys> -> v<i>`; returns the (key, value) pairs in order."""
        producer = Producer({"bootstrap.servers": self.bootstrap, "partitioner": "murmur2_random",
                             "enable.idempotence": True})
        values: list[tuple[bytes, bytes]] = []
        for i in range(first, first + count):
            value = POISON if poison_every and i % poison_every == poison_every - 1 else f"v{i}".encode()
            key = f"k{i % keys}".encode()
            producer.produce(self.inputs, key=key, value=value)
            values.append((key, value))
        assert producer.flush(30) == 0
        return values

    def read_committed(self, topic: str) -> list[tuple[bytes | None, bytes | None]]:
        """Every record of `topic` a read_committed reader sees now, partition by partition."""
        return [(key, value) for key, value, _ in read_committed(self.bootstrap, topic)]

    def out_values(self) -> list[bytes]:
        """The input value of each `out` record (what precedes `|`)."""
        return [(value or b"").split(b"|")[0] for _, value in self.read_committed(self.out)]

    def wait_for_out(self, at_least: int, timeout: float = 60.0) -> int:
        return wait_until(lambda: (n := len(self.read_committed(self.out))) >= at_least and n,
                          timeout, f"{at_least} records on {self.out}")

    def counts(self) -> dict[bytes, int]:
        found: dict[bytes, int] = {}
        for partition in range(self.partitions):
            if (self.store / f"p{partition}").exists():
                found.update(read_counts(self.store, partition))
        return found

    def committed_offsets(self) -> dict[int, int]:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group})
        try:
            tps = [TopicPartition(self.inputs, p) for p in range(self.partitions)]
            return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}
        finally:
            consumer.close()


def read_committed(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None, int]]:
    """Every (key, value, partition) of `topic` a read_committed reader sees now."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        records: list[tuple[bytes | None, bytes | None, int]] = []
        for partition in sorted(partitions):
            tp = TopicPartition(topic, partition)
            low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, low)])
            position = low
            while position < high:
                for message in consumer.consume(500, timeout=1.0):
                    assert message.error() is None, message.error()
                    records.append((message.key(), message.value(), partition))
                (current,) = consumer.position([tp])
                position = max(position, current.offset)
        return records
    finally:
        consumer.close()


def assert_exactly_once(rig: CounterRig, inputs: list[tuple[bytes, bytes]]) -> None:
    """Every input once on `out`, none missing; each key's count equals its non-poison inputs."""
    seen = Counter(rig.out_values())
    twice = {v: n for v, n in seen.items() if n > 1 and v != POISON}
    assert not twice, f"inputs folded more than once: {sorted(twice)[:10]}"
    missing = [v for _, v in inputs if v not in seen]
    assert not missing, f"inputs never folded: {missing[:10]}"
    assert seen[POISON] == sum(1 for _, v in inputs if v == POISON)
    expected = Counter(k for k, v in inputs if v != POISON)
    assert rig.counts() == dict(expected)


def assert_counts_are_gapless(rig: CounterRig, inputs: list[tuple[bytes, bytes]]) -> None:
    """Each key's counts on `out` are exactly 1..n: no input counted twice, even across owners."""
    counts: dict[bytes, list[int]] = {}
    for key, value in rig.read_committed(rig.out):
        _, _, count = (value or b"").partition(b"|")
        if key is not None and count != b"parked":
            counts.setdefault(key, []).append(int(count))
    expected = Counter(k for k, v in inputs if v != POISON)
    gapless = {k: list(range(1, n + 1)) for k, n in expected.items()}
    assert {k: sorted(c) for k, c in counts.items()} == gapless
