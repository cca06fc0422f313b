"""The in-process log: partitions by murmur2, offsets from 0, reads from an offset."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torpor.streams.log import InProcessLog, LogTopic, partition_of
from torpor.streams.partitioner import partition_for

TOPIC = LogTopic[str]("inputs", 4)


def test_keyed_records_land_on_the_murmur2_partition_in_offset_order() -> None:
    log = InProcessLog()
    placed = [log.append(TOPIC, "thread-a", f"v{i}") for i in range(3)]
    expected = partition_for(b"thread-a", 4)
    assert {r.partition for r in placed} == {expected} == {partition_of(TOPIC, "thread-a")}
    assert [r.offset for r in placed] == [0, 1, 2]
    assert [r.value for r in log.read(TOPIC, expected, 1)] == ["v1", "v2"]
    assert [r.value for r in log.read(TOPIC, expected, 0, max_records=1)] == ["v0"]
    assert log.end_offset(TOPIC, expected) == 3


@given(key=st.text() | st.binary(), partitions=st.integers(min_value=1, max_value=64))
def test_partition_of_is_murmur2_for_every_partition_count_one_included(
    key: str | bytes, partitions: int
) -> None:
    raw = key.encode("utf-8") if isinstance(key, str) else key
    assert partition_of(LogTopic[str]("t", partitions), key) == partition_for(raw, partitions)


def test_an_explicit_partition_wins_over_the_key() -> None:
    log = InProcessLog()
    record = log.append(TOPIC, "thread-a", "x", partition=3)
    assert (record.partition, record.offset) == (3, 0)
    assert len(log.read_all(TOPIC)) == 1


def test_a_topic_keeps_its_partition_count_and_range() -> None:
    log = InProcessLog()
    log.append(TOPIC, "k", "x")
    with pytest.raises(ValueError):
        log.append(LogTopic[str]("inputs", 2), "k", "x")
    with pytest.raises(ValueError):
        log.read(TOPIC, 4, 0)
    with pytest.raises(ValueError):
        LogTopic[str]("none", 0)


@pytest.mark.parametrize("partitions", [1, 4])
@given(keys=st.lists(st.sampled_from(["a", "b", "thread-c", b"d"]), max_size=12),
       split=st.integers(min_value=0, max_value=12))
def test_append_all_places_records_as_appending_them_one_by_one_would(
    partitions: int, keys: list[str | bytes], split: int
) -> None:
    topic = LogTopic[str]("events", partitions)
    items = [(key, f"v{i}") for i, key in enumerate(keys)]
    one_by_one = InProcessLog()
    expected = [one_by_one.append(topic, key, value) for key, value in items]
    log = InProcessLog()
    placed = [*log.append_all(topic, items[:split]), *log.append_all(topic, items[split:])]
    assert placed == expected
    assert log.read_all(topic) == one_by_one.read_all(topic)
    trimmed = InProcessLog()  # after a trim the offsets go on counting, for both ways in
    trimmed.append_all(topic, items[:split])
    trimmed.trim()
    again = [*trimmed.append_all(topic, items[split:])]
    assert again == expected[split:]
    assert trimmed.read_all(topic) == tuple(sorted(again, key=lambda r: (r.partition, r.offset)))


def test_append_all_keeps_a_topics_partition_count() -> None:
    log = InProcessLog()
    log.append(TOPIC, "k", "x")
    with pytest.raises(ValueError):
        log.append_all(LogTopic[str]("inputs", 1), [("k", "y")])
    assert log.append_all(TOPIC, []) == []


def test_a_trimmed_log_keeps_counting_and_refuses_a_read_of_what_it_dropped() -> None:
    log = InProcessLog()
    for i in range(3):
        log.append(TOPIC, "k", f"v{i}")
    where = partition_of(TOPIC, "k")
    assert log.trim() == 3 and log.read_all(TOPIC) == () and log.end_offset(TOPIC, where) == 3
    record = log.append(TOPIC, "k", "v3")
    assert record.offset == 3 and [r.value for r in log.read(TOPIC, where, 3)] == ["v3"]
    with pytest.raises(ValueError, match="trimmed"):
        log.read(TOPIC, where, 2)
