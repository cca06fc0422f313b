"""The loop's conversion of a consumed message into the task's `InputRecord` (no broker)."""

from __future__ import annotations

from confluent_kafka import Message

from torpor.streams.loop import _record_of


def test_a_record_with_headers_hands_them_to_the_task_in_order() -> None:
    message = Message(topic="in", partition=2, offset=7, key=b"t1", value=b"v",
                      headers=[("traceparent", b"00-x"), ("other", None), ("traceparent", b"dup")],
                      timestamp=(1, 10))
    record = _record_of(message)
    assert record.headers == (("traceparent", b"00-x"), ("other", None), ("traceparent", b"dup"))
    assert (record.partition, record.offset, record.key, record.value) == (2, 7, b"t1", b"v")


def test_a_record_without_headers_has_none() -> None:
    assert _record_of(Message(topic="in", partition=0, offset=0, key=b"t", value=b"v")).headers is None
