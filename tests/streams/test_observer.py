"""The observer API against a real broker, with events produced here as a processor would.

Committed events go in transactions, live deltas and a poison record outside them, and a
transaction is left open while the snapshot is taken: the snapshot must stop at what is
committed (the partial text included, the open transaction not), and `follow` must then
yield the rest once, starting exactly where the snapshot stopped.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from torpor.schemas.codec import encode_value
from torpor.schemas.records import HistoryEntry, TextBlock, ThreadEvent, UserEntry
from torpor.streams.admin import ensure_topics
from torpor.streams.config import KafkaSettings, Settings, TopicSettings
from torpor.streams.deadline import Deadline
from torpor.streams.observer import Observed, Observer, Position, Undecodable
from torpor.streams.partitioner import partition_for
from torpor.streams.topics import TopicNames

pytestmark = pytest.mark.kafka

PARTITIONS = 3


@pytest.fixture
def settings(kafka_bootstrap: str, admin: AdminClient) -> Iterator[Settings]:
    topics = TopicSettings(prefix=f"test.observer.{uuid.uuid4().hex[:10]}.", partitions=PARTITIONS)
    found = Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap), topics=topics)
    ensure_topics(AdminClient({"bootstrap.servers": kafka_bootstrap}), found, Deadline.after(60))
    yield found
    names = list(TopicNames.for_prefix(found.topics.prefix).all())
    for future in admin.delete_topics(names, operation_timeout=30).values():
        future.result(timeout=60)


def event(thread: str, kind: str, *, entry: HistoryEntry | None = None, text: str | None = None,
          ephemeral: bool = False) -> ThreadEvent:
    return ThreadEvent(event_id=f"{thread}-{kind}-{text}", thread_id=thread, created_at=1, kind=kind,
                       ephemeral=ephemeral, seq=entry.seq if entry else None, entry=entry, text=text,
                       data=json.dumps({"parent": None}) if kind == "thread_created" else None)


def test_a_snapshot_stops_at_what_is_committed_and_follow_continues_once(settings: Settings) -> None:
    topic = TopicNames.for_prefix(settings.topics.prefix).events
    thread = "observed-thread"
    # Another thread on the same partition: its events must be filtered out, not counted.
    other = next(f"other-{i}" for i in range(1000) if partition_for(f"other-{i}".encode(), PARTITIONS)
                 == partition_for(thread.encode(), PARTITIONS))
    partition = partition_for(thread.encode(), PARTITIONS)

    def put(producer: Producer, value: bytes, key: str = thread) -> None:
        producer.produce(topic, key=key.encode(), value=value, partition=partition)

    said = HistoryEntry(seq=0, created_at=1, input_id="i0", body=UserEntry((TextBlock("hi"),), False))
    transactional = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                              "transactional.id": f"observer-test-{uuid.uuid4().hex}"})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    for record in (event(thread, "thread_created"), event(thread, "input_accepted", entry=said),
                   event(other, "thread_created"), event(thread, "completion_requested")):
        put(transactional, encode_value(record), record.thread_id)
    transactional.commit_transaction(30)
    plain = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    put(plain, encode_value(event(thread, "delta", text="Hel", ephemeral=True)))
    put(plain, b"\x00 not an event")
    put(plain, encode_value(event(thread, "delta", text="lo", ephemeral=True)))
    assert plain.flush(30) == 0
    transactional.begin_transaction()
    # Written inside a transaction left open: held back from read_committed until it commits.
    put(transactional, encode_value(event(thread, "delta", text="!", ephemeral=True)))
    assert transactional.flush(30) == 0

    with Observer(settings) as observer:
        snapshot = observer.snapshot(thread, Deadline.after(60))
        assert snapshot.complete, snapshot.missing
        assert [e.seq for e in snapshot.entries] == [0]
        kinds = [e.kind for e in snapshot.events]
        assert kinds == ["thread_created", "input_accepted", "completion_requested"]
        assert snapshot.partial == "Hello"
        # Offsets 0-3 are the first transaction, 4 its commit marker, 5 a delta, 6 the poison record.
        assert [(u.partition, u.offset) for u in snapshot.undecodable] == [(partition, 6)]
        assert Position.from_json(snapshot.position.as_json()) == snapshot.position

        turn = HistoryEntry(seq=1, created_at=2, input_id="i1", body=UserEntry((TextBlock("more"),), False))
        put(transactional, encode_value(event(thread, "input_accepted", entry=turn)))
        transactional.commit_transaction(30)
        seen: list[Observed | Undecodable] = []
        for item in observer.follow(snapshot.position, threads=[thread], deadline=Deadline.after(60)):
            seen.append(item)
            if isinstance(item, Observed) and isinstance(item.record, ThreadEvent) and item.record.entry:
                break
        records = [i.record for i in seen if isinstance(i, Observed)]
        assert [(r.kind, r.text) for r in records if isinstance(r, ThreadEvent)] == [
            ("delta", "!"), ("input_accepted", None)]

        missing = observer.snapshot("never-created", Deadline.after(60))
        assert not missing.complete and missing.missing and "creation" in missing.missing


def test_a_position_from_json_refuses_what_is_not_one() -> None:
    assert Position.from_json({"t.events:2": 7}).offsets == {("t.events", 2): 7}
    for bad in ({"t.events": 7}, {"t.events:x": 7}, {"t.events:1": "7"}, {"t.events:1": -5}):
        with pytest.raises(ValueError, match="not a position entry"):
            Position.from_json(bad)
