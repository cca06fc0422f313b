"""`TimeOrder`: events and receipts merged by time, each partition's records kept in offset order."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.cli.test_render import event, receipt
from torpor.cli.timeorder import TimeOrder
from torpor.streams.observer import Item, Observed, Undecodable

Read = tuple[str, int, int]  # (topic, partition, time): one record, in read order


def _item(topic: str, partition: int, offset: int, at: int) -> Observed:
    base = event("t", "input_accepted") if topic == "events" else receipt("t")
    return dataclasses.replace(base, partition=partition, offset=offset,
                               record=dataclasses.replace(base.record, created_at=at))


def _items(reads: list[Read]) -> list[Item]:
    offsets: dict[tuple[str, int], int] = {}
    items: list[Item] = []
    for topic, partition, at in reads:
        offset = offsets.get((topic, partition), 0)
        offsets[(topic, partition)] = offset + 1
        items.append(_item(topic, partition, offset, at))
    return items


def _merge(items: list[Item], window: int = 50_000) -> list[Item]:
    order = TimeOrder(window)
    out = [released for item in items for released in order.add(item)]
    return out + list(order.drain())


def _time(item: Item) -> int:
    assert isinstance(item, Observed)
    return item.record.created_at


reads = st.lists(st.tuples(st.sampled_from(["events", "receipts"]), st.integers(0, 2), st.integers(0, 50)),
                 max_size=60)


def test_events_then_receipts_read_come_out_interleaved_by_time() -> None:
    # What the consumer hands over: a partition of events, then one of receipts.
    items = _items([("events", 0, 10), ("events", 0, 20), ("events", 0, 30),
                    ("receipts", 0, 10), ("receipts", 0, 20), ("receipts", 0, 30)])
    merged = _merge(items)
    assert [(i.topic, _time(i)) for i in merged] == [
        ("events", 10), ("receipts", 10), ("events", 20), ("receipts", 20), ("events", 30), ("receipts", 30)]


@given(reads)
def test_each_partition_keeps_its_offset_order_and_nothing_is_lost_or_repeated(read: list[Read]) -> None:
    items = _items(read)
    merged = _merge(items, window=7)
    assert sorted(merged, key=id) == sorted(items, key=id)
    for where in {(i.topic, i.partition) for i in items}:
        assert [i.offset for i in merged if (i.topic, i.partition) == where] == \
            [i.offset for i in items if (i.topic, i.partition) == where]


@given(reads)
def test_partitions_in_time_order_merge_into_time_order(read: list[Read]) -> None:
    # Each partition's times ascending (one clock), read in any interleaving.
    ordered = sorted(read, key=lambda r: r[2])
    by_partition = {(t, p): sorted(r[2] for r in ordered if (r[0], r[1]) == (t, p)) for t, p, _ in ordered}
    reassigned = [(t, p, by_partition[(t, p)].pop(0)) for t, p, _ in read]
    merged = _merge(_items(reassigned))
    assert [_time(i) for i in merged] == sorted(_time(i) for i in merged)


@given(reads, st.integers(1, 10))
def test_it_never_holds_more_than_its_window(read: list[Read], window: int) -> None:
    order = TimeOrder(window)
    for item in _items(read):
        list(order.add(item))
        assert len(order) <= window


def test_ties_go_to_the_record_read_first() -> None:
    items = _items([("receipts", 1, 5), ("events", 0, 5)])
    assert [i.topic for i in _merge(items)] == ["receipts", "events"]


def test_an_undecodable_record_follows_the_record_before_it_in_its_partition() -> None:
    bad = Undecodable("events", 0, 1, "bad bytes")
    items = [_item("events", 0, 0, 10), bad, _item("events", 0, 2, 30), _item("receipts", 0, 0, 20)]
    assert [(i.topic, i.offset) for i in _merge(items)] == [
        ("events", 0), ("events", 1), ("receipts", 0), ("events", 2)]


def test_a_window_must_hold_a_record() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        TimeOrder(0)
