"""A trivial `PartitionTask` for the loop's tests: a counter per key, in RocksDB.

Each input record `key -> value` increments the key's count in the store and produces
`key -> b"<value>|<count>"` to the `out` topic, in the transaction. An input whose value
is `b"poison"` is not counted: it goes to the `parked` topic, and its "receipt" to `out`
as `b"<value>|parked"`. So under exactly-once every input value appears on `out` once,
and each key's count in the store equals its number of non-poison inputs.

Run as a process (`python -m tests.streams.counter_task ...`) so tests can kill it with
SIGKILL. Crash points for tests, by environment variable (the process `os._exit(9)`s):

- `COUNTER_CRASH_IN_PROCESS=N`: after folding N records, before any commit of them.
- `COUNTER_CRASH_AFTER_COMMIT=N`: at the N-th commit, after the Kafka transaction
  committed and before the store write (the store lags the changelog).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from confluent_kafka import Consumer
from rocksdict import Options, Rdict, WriteBatch

from torpor.cli.logs import configure
from torpor.streams.clients import make_admin, make_consumer, make_producer
from torpor.streams.config import KafkaSettings, Settings, producer_config
from torpor.streams.loop import CheckpointLoop, LoopSettings
from torpor.streams.renewal import ProducerRenewal
from torpor.streams.task import Change, InputRecord, OutputRecord, StoredOffsets, TaskOutput

POISON: Final = b"poison"
_META_CHANGELOG: Final = b"\x00meta.changelog"
_META_INPUT: Final = b"\x00meta.input"


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    return int(raw) if raw else None


class CounterTask:
    """Counts inputs per key; the store is `<root>/p<partition>` (see the module docstring)."""

    folded = 0  # records folded by every task of the process, for the crash points
    commits = 0

    def __init__(self, root: Path, partition: int, out_topic: str, parked_topic: str) -> None:
        self.path = root / f"p{partition}"
        self.out_topic = out_topic
        self.parked_topic = parked_topic
        self._db = self._open()
        self._overlay: dict[bytes, bytes | None] = {}

    def _open(self) -> Rdict:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        return Rdict(str(self.path), options)

    def _get(self, key: bytes) -> bytes | None:
        if key in self._overlay:
            return self._overlay[key]
        value = self._db.get(key)
        assert value is None or isinstance(value, bytes)
        return value

    def offsets(self) -> StoredOffsets:
        changelog, inputs = self._db.get(_META_CHANGELOG), self._db.get(_META_INPUT)
        return StoredOffsets(
            None if changelog is None else int(changelog), None if inputs is None else int(inputs)
        )

    def _write(self, changes: Sequence[Change], offsets: StoredOffsets) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in changes:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        if offsets.changelog_offset is not None:
            batch.put(_META_CHANGELOG, str(offsets.changelog_offset).encode())
        if offsets.input_offset is not None:
            batch.put(_META_INPUT, str(offsets.input_offset).encode())
        self._db.write(batch)

    def restore(self, changes: Sequence[Change], offsets: StoredOffsets) -> None:
        self._write(changes, offsets)

    def start(self) -> None:
        pass  # nothing is left in flight by a counter

    def process(self, records: Sequence[InputRecord]) -> TaskOutput:
        out: list[OutputRecord] = []
        changes: list[Change] = []
        crash_at = _env_int("COUNTER_CRASH_IN_PROCESS")
        for record in records:
            value = record.value or b""
            if value == POISON or record.key is None:
                out.append(OutputRecord(self.parked_topic, record.key, record.value))
                out.append(OutputRecord(self.out_topic, record.key, value + b"|parked"))
            else:
                count = int(self._get(record.key) or b"0") + 1
                self._overlay[record.key] = str(count).encode()
                changes.append((record.key, str(count).encode()))
                out.append(OutputRecord(self.out_topic, record.key, value + b"|" + str(count).encode()))
            CounterTask.folded += 1
            if crash_at is not None and CounterTask.folded >= crash_at:
                os._exit(9)
        return TaskOutput(tuple(out), tuple(changes))

    def commit(self, offsets: StoredOffsets) -> None:
        CounterTask.commits += 1
        if CounterTask.commits == _env_int("COUNTER_CRASH_AFTER_COMMIT"):
            os._exit(9)
        self._write(list(self._overlay.items()), offsets)
        self._overlay.clear()

    def abort(self) -> None:
        self._overlay.clear()

    def wipe(self) -> None:
        self._db.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self._db = self._open()
        self._overlay.clear()

    def close(self) -> None:
        self._db.close()


def read_counts(root: Path, partition: int) -> dict[bytes, int]:
    """The counts a (closed) store holds, metadata rows left out."""
    options = Options(raw_mode=True)
    db = Rdict(str(root / f"p{partition}"), options)
    try:
        return {k: int(v) for k, v in db.items() if not k.startswith(b"\x00")}
    finally:
        db.close()


def read_offsets(root: Path, partition: int) -> StoredOffsets:
    task = CounterTask(root, partition, "", "")
    try:
        return task.offsets()
    finally:
        task.close()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "inputs", "changelog", "out", "parked", "group", "instance", "store"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--until-idle", action="store_true")
    parser.add_argument("--commit-every", type=int, default=1000)
    parser.add_argument("--max-batch", type=int, default=500)
    # Small fetches interleave the partitions in the consumer's queue (a big fetch brings
    # one partition's whole backlog first), so every partition makes progress early.
    parser.add_argument("--fetch-bytes", type=int, default=None)
    # The loop's budget for one transaction call (a commit that times out is resumed after it).
    parser.add_argument("--transaction-timeout", type=float, default=None)
    # The broker-side transaction.timeout.ms: a test that stalls the broker keeps it well
    # above the stall, so the broker does not abort the transaction being resumed.
    parser.add_argument("--txn-timeout-ms", type=int, default=None)
    # How long a fenced consumer waits for its instance id to be released (LoopSettings.rejoin_wait).
    parser.add_argument("--rejoin-wait", type=float, default=None)
    # The producer's local queue (queue.buffering.max.messages): a tiny one is found full often.
    parser.add_argument("--queue-messages", type=int, default=None)
    # The transactional producer's linger.ms (config.TRANSACTIONAL_LINGER_MS by default): 0
    # sends each record at once, so a refusal reaches the fold while it goes on.
    parser.add_argument("--linger-ms", type=int, default=None)
    args = parser.parse_args(argv)
    configure("info")
    overrides: tuple[tuple[str, str], ...] = ()
    if args.fetch_bytes is not None:
        overrides += (("max.partition.fetch.bytes", str(args.fetch_bytes)),)
    if args.txn_timeout_ms is not None:
        overrides += (("transaction.timeout.ms", str(args.txn_timeout_ms)),)
    if args.linger_ms is not None:
        overrides += (("linger.ms", str(args.linger_ms)),)
    if args.queue_messages is not None:
        overrides += (("queue.buffering.max.messages", str(args.queue_messages)),)
    timing = {} if args.transaction_timeout is None else {"transaction_timeout": args.transaction_timeout}
    if args.rejoin_wait is not None:
        timing["rejoin_wait"] = args.rejoin_wait
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=args.bootstrap, librdkafka_overrides=overrides))
    root = Path(args.store)
    def new_consumer() -> Consumer:
        return make_consumer(settings, args.group, instance_id=args.instance)

    consumer = new_consumer()
    restore_consumer = make_consumer(settings, f"{args.group}.restore")
    transactional_id = f"{args.group}-{args.instance}"
    producer = make_producer(settings, transactional_id=transactional_id)
    # As the processor wires it: a producer that fenced itself is renewed, a zombie's is not.
    expiry_ms = producer_config(settings, transactional_id=transactional_id)["transaction.timeout.ms"]
    renewal = ProducerRenewal(lambda: make_producer(settings, transactional_id=transactional_id),
                              make_admin(settings), args.group, args.instance, float(expiry_ms) / 1000,
                              new_consumer)
    loop = CheckpointLoop(
        consumer, producer, restore_consumer,
        lambda partition: CounterTask(root, partition, args.out, args.parked),
        LoopSettings(args.inputs, args.changelog, commit_every=args.commit_every, max_batch=args.max_batch,
                     **timing),
        renewal=renewal,
    )
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    try:
        loop.run(lambda: bool(stopping), until_idle=args.until_idle)
        loop.close()
    except Exception as exc:
        print(f"fatal: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        os._exit(2)
    print(f"done: commits={loop.commits} aborts={loop.aborts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
