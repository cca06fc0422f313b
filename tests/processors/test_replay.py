"""`torpor replay` and `torpor history` over what a real processor folded through a real broker.

One module-scoped run: a processor and the echo connector fold two threads (one of them
over two turns with a tool call between), then stop. The tests re-fold the `inputs`
topic and compare with the live stores and the changelog; corrupt a copy of a store
and see the replay report it; read the history from the store and from the changelog;
and travel back to an earlier offset of a thread's partition.
"""

from __future__ import annotations

import datetime
import json
import shutil
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.processors.test_processor import (
    PARTITIONS,
    TORPOR,
    Deployment,
    _conversation,
    _input,
)
from tests.waiting import wait_until
from torpor.processors.fold.verify import SourceVerifier
from torpor.processors.replay import LogRecord, Replayer, compare, read_log, thread_heads
from torpor.processors.step import StepRecord, step
from torpor.processors.store import keys
from torpor.processors.store.kv import MemoryStore, RocksStore
from torpor.processors.store.statecodec import decode_entry, encode_entry
from torpor.schemas.codec import Codec, decode_value, encode_value
from torpor.schemas.records import Input, TextBlock, UserEntry, UserMessage
from torpor.streams.admin import ensure_topics
from torpor.streams.config import KafkaSettings, Settings, TopicSettings
from torpor.streams.deadline import Deadline
from torpor.streams.partitioner import partition_for
from torpor.streams.topics import TopicNames


@dataclass(frozen=True)
class Folded:
    deployment: Deployment
    talker: str  # two turns: a tool call, then a plain answer
    greeter: str  # one turn

    @property
    def store_dir(self) -> Path:
        return self.deployment.root / "stores-p0"


@pytest.fixture(scope="module")
def folded(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Folded]:
    deployment = Deployment(kafka_bootstrap, tmp_path_factory.mktemp("replay"))
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap, "log_level": 2})
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
                        topics=TopicSettings(prefix=deployment.prefix, partitions=PARTITIONS))
    ensure_topics(admin, settings, Deadline.after(60))
    talker, greeter = f"talker-{uuid.uuid4().hex[:6]}", f"greeter-{uuid.uuid4().hex[:6]}"
    try:
        deployment.send(*_conversation(talker, "please ping"), *_conversation(greeter, "hello"))
        processor = deployment.start(deployment.processor_args(), "processor")
        echo = deployment.start([TORPOR, "connector", "run-echo", "--group", f"echo-{deployment.prefix}"],
                                "echo")
        wait_until(lambda: "The echo said ping." in deployment.answers(talker), timeout=120,
                   message=lambda: f"the first turn; processor log:\n{deployment.log('processor')[-3000:]}")
        deployment.send(_input(talker, f"{talker}-again", 3_000, UserMessage((TextBlock("hello"),))))
        wait_until(lambda: deployment.answers(talker)[-1:] == ["Hello to you."]
                   and deployment.answers(greeter) == ["Hello to you."], timeout=120,
                   message=lambda: f"the second turn; processor log:\n{deployment.log('processor')[-3000:]}")
        wait_until(lambda: "started in group" in deployment.log("processor"), timeout=60,
                   message="the processor installed its stop handlers")
        for process in (processor, echo):
            process.send_signal(signal.SIGTERM)
        assert processor.wait(timeout=60) == 0, deployment.log("processor")[-3000:]
        assert echo.wait(timeout=60) == 0, deployment.log("echo")[-3000:]
        yield Folded(deployment, talker, greeter)
    finally:
        deployment.stop_all()
        names = list(TopicNames.for_prefix(deployment.prefix).all())
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result(timeout=60)


def _counts(deployment: Deployment) -> dict[str, int]:
    """The end offset of every partition of the topics a replay must not write to."""
    consumer = Consumer({"bootstrap.servers": deployment.bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    try:
        return {f"{suffix}[{p}]": consumer.get_watermark_offsets(
                    TopicPartition(deployment.topic(suffix), p), timeout=10, cached=False)[1]
                for suffix in ("inputs", "outbox", "events", "receipts", "parked") for p in range(PARTITIONS)}
    finally:
        consumer.close()


@pytest.mark.kafka
def test_replay_matches_the_live_store_and_the_changelog_and_produces_nothing(folded: Folded) -> None:
    deployment = folded.deployment
    before = _counts(deployment)
    for where in (["--no-progress", "--store-dir", str(folded.store_dir)], []):
        result = deployment.run([TORPOR, "replay", *where])
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert sorted(line.split()[0] for line in lines) == sorted([folded.talker, folded.greeter])
        assert all(line.endswith("  ok") for line in lines), lines
        assert "2 threads, 0 differ" in result.stderr
    assert "records/s" in result.stderr.split("replayed")[0]  # the progress line, before the summary
    one = deployment.run([TORPOR, "replay", "--no-progress", "--thread", folded.greeter])
    assert one.returncode == 0, one.stdout + one.stderr
    assert [line.split()[0] for line in one.stdout.splitlines()] == [folded.greeter]
    assert _counts(deployment) == before  # nothing produced: the log already holds every output


@pytest.mark.kafka
def test_a_corrupted_history_row_in_a_copy_of_the_store_is_reported(folded: Folded, tmp_path: Path) -> None:
    copy = tmp_path / "store-copy"
    shutil.copytree(folded.store_dir, copy)
    store = RocksStore(copy / f"partition-{partition_for(folded.talker.encode(), PARTITIONS)}")
    try:
        key = keys.history_key(folded.talker, 0)
        raw = store.get(key)
        assert raw is not None
        entry = decode_entry(raw)
        assert isinstance(entry.body, UserEntry)
        store.put(key, encode_entry(replace(entry, body=UserEntry((TextBlock("please pong"),), False))))
    finally:
        store.close()
    # A row outside the history: the greeter forgets it saw its text (a redelivery would fold twice).
    store = RocksStore(copy / f"partition-{partition_for(folded.greeter.encode(), PARTITIONS)}")
    try:
        seen = keys.seen_key(folded.greeter, f"{folded.greeter}-hello")
        assert store.get(seen) is not None
        store.delete(seen)
    finally:
        store.close()
    result = folded.deployment.run([TORPOR, "replay", "--no-progress", "--json", "--store-dir", str(copy)])
    assert result.returncode == 1, result.stdout + result.stderr
    reasons = {m["thread_id"]: m["reason"] for m in json.loads(result.stdout)["mismatches"]}
    assert set(reasons) == {folded.talker, folded.greeter}
    assert "do not chain" in reasons[folded.talker]
    assert "rows differ" in reasons[folded.greeter]
    # The untouched original still matches.
    clean = folded.deployment.run([TORPOR, "replay", "--no-progress", "--store-dir", str(folded.store_dir)])
    assert clean.returncode == 0, clean.stdout + clean.stderr


def _history(folded: Folded, thread_id: str, *where: str) -> dict[str, object]:
    result = folded.deployment.run([TORPOR, "history", thread_id, "--json", *where])
    assert result.returncode == 0, result.stderr
    found: dict[str, object] = json.loads(result.stdout)
    return found


@pytest.mark.kafka
def test_history_from_the_store_equals_history_from_the_changelog(folded: Folded) -> None:
    from_store = _history(folded, folded.talker, "--store-dir", str(folded.store_dir))
    from_changelog = _history(folded, folded.talker, "--from-changelog")
    assert from_store == from_changelog
    talker = from_store["entries"]
    assert isinstance(talker, list)
    assert len(talker) == from_store["history_len"]
    assert talker[-1]["head"] == from_store["head"] == from_store["chained"]
    kinds = [e["kind"] for e in talker]
    assert kinds == ["user", "assistant", "tool_result", "assistant", "user", "assistant"]
    assert talker[-1]["content"] == "Hello to you."
    text = folded.deployment.run([TORPOR, "history", folded.talker, "--store-dir", str(folded.store_dir)])
    assert text.returncode == 0 and len(text.stdout.splitlines()) == len(talker)
    missing = folded.deployment.run([TORPOR, "history", "no-such-thread", "--from-changelog"])
    assert missing.returncode == 1 and "no thread" in missing.stderr


@pytest.mark.kafka
def test_time_travel_to_an_earlier_offset_shows_the_history_as_it_stood(folded: Folded) -> None:
    deployment = folded.deployment
    consumer = Consumer({"bootstrap.servers": deployment.bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        records = list(read_log(consumer, deployment.topic("inputs"), thread_id=folded.talker))
    finally:
        consumer.close()
    wanted = f"{folded.talker}-again"
    again = next(r for r in records if decode_value(r.value or b"", Input).message_id == wanted)
    full = _history(folded, folded.talker, "--from-changelog")["entries"]
    assert isinstance(full, list)
    result = deployment.run([TORPOR, "replay", "--thread", folded.talker, "--at", str(again.offset - 1),
                             "--json", "--no-progress"])
    assert result.returncode == 0, result.stderr
    earlier = json.loads(result.stdout)["entries"]
    assert 0 < len(earlier) < len(full)
    assert earlier == full[: len(earlier)]  # the same entries, byte for byte (their heads chain alike)
    assert earlier[-1]["content"] == "The echo said ping."
    # At the offset of the second message itself, it is in.
    at = json.loads(deployment.run([TORPOR, "replay", "--thread", folded.talker, "--at", str(again.offset),
                                    "--json", "--no-progress"]).stdout)["entries"]
    assert at[-1]["kind"] == "user" and len(at) == len(earlier) + 1
    # The same cut by offset, and by the record time just before the second message.
    partition = partition_for(folded.talker.encode(), PARTITIONS)
    until = datetime.datetime.fromtimestamp((again.timestamp_ms - 1) / 1000, datetime.UTC).isoformat()
    for cut in (["--until-offset", f"{partition}:{again.offset - 1}"], ["--until-time", until]):
        result = deployment.run([TORPOR, "replay", "--json", "--no-progress", *cut])
        assert result.returncode == 0, result.stderr
        heads = json.loads(result.stdout)["threads"]
        assert heads[folded.talker]["history_len"] == len(earlier), (cut, heads)


def test_the_replayer_skips_what_the_processor_parks_and_folds_the_rest_like_step() -> None:
    thread_id = "unit-replayer"
    create, hello = _conversation(thread_id, "hello")
    records = [
        LogRecord(0, 0, 0, thread_id.encode(), encode_value(create)),
        LogRecord(0, 1, 0, thread_id.encode(), b"not avro at all"),
        LogRecord(0, 2, 0, thread_id.encode(), encode_value(hello) + b" " * 2_000),  # too big
        LogRecord(0, 3, 0, thread_id.encode(), None),
        LogRecord(0, 4, 0, thread_id.encode(), encode_value(hello)),
    ]
    replayer = Replayer(SourceVerifier(), Codec(), "inputs", max_bytes=1_000)
    for record in records:
        replayer.feed(record)
    replayed = replayer.finish()[0]
    assert (replayer.counts.folded, replayer.counts.parked) == (2, 3)
    direct = MemoryStore()
    step(direct, [StepRecord(create, 0, 0), StepRecord(hello, 0, 4)], verifier=SourceVerifier())
    assert list(replayed.iterate(b"")) == list(direct.iterate(b""))
    heads = thread_heads({0: replayed})
    assert compare(heads, thread_heads({0: direct})) == []
    assert heads[thread_id].consistent and heads[thread_id].history_len == 1
    differs = compare(heads, {})
    assert [(m.thread_id, m.reason.split(":")[0]) for m in differs] == [(thread_id, "replay only")]
