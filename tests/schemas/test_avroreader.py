"""The direct Avro reader reads exactly what fastavro reads, and leaves to fastavro what it cannot.

The reader is trusted with bytes from anyone who can write to a topic: whatever it returns
a value for, fastavro (and the conversion plan) must return the same value for, ending at
the same byte; everything else must go back to fastavro, whose verdict the codec reports.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.schemas.strategies import records
from torpor.schemas import records as r
from torpor.schemas.avroreader import NotReadable, read_long, record_reader
from torpor.schemas.codec import default_codec
from torpor.schemas.errors import DecodeError

TOP_LEVEL = (r.Input, r.Dispatch, r.ThreadEvent, r.Receipt, r.HistoryEntry)


def fastavro_read(cls: type, data: bytes, pos: int) -> tuple[object, int]:
    codec = default_codec()._class(cls)
    buf = io.BytesIO(data)
    buf.seek(pos)
    datum = fastavro.schemaless_reader(buf, codec.schema.parsed, None, return_record_name=True,
                                       return_record_name_override=True)
    assert isinstance(datum, dict)
    return codec.plan.from_avro(datum), buf.tell()


def _body(record: object) -> bytes:
    """`record`'s Avro body, without the framing."""
    direct = default_codec()._class(type(record)).direct
    assert direct is not None
    return direct(record)


def direct_reader(cls: type) -> Callable[[bytes, int], tuple[object, int]]:
    reader = default_codec()._class(cls).reader
    assert reader is not None  # every shipped schema is within what the reader reads
    return reader


@settings(max_examples=300, deadline=None)
@given(st.one_of([records(cls) for cls in TOP_LEVEL]))
def test_every_record_is_read_as_fastavro_reads_it(record: object) -> None:
    cls = type(record)
    codec = default_codec()
    data = codec.encode("t", record)
    header = len(data) - len(_body(record))
    assert direct_reader(cls)(data, header) == fastavro_read(cls, data, header) == (record, len(data))
    assert codec.decode("t", data, cls) == record


@st.composite
def damaged(draw: st.DrawFn) -> tuple[type, bytes]:
    """A record's body, then cut, changed, grown or replaced: what a hostile writer sends."""
    record = draw(st.one_of([records(cls) for cls in TOP_LEVEL]))
    body = bytearray(_body(record))
    how = draw(st.sampled_from(["cut", "flip", "insert", "append", "splice", "noise"]))
    at = draw(st.integers(0, len(body)))
    junk = draw(st.binary(min_size=1, max_size=12))
    if how == "cut":
        body = body[:at]
    elif how == "flip" and body:
        index = min(at, len(body) - 1)
        body[index] ^= draw(st.integers(1, 255))
    elif how == "insert":
        body[at:at] = junk
    elif how == "append":
        body += junk
    elif how == "splice":
        body[at:at + len(junk)] = junk
    else:
        body = bytearray(draw(st.binary(max_size=64)))
    return type(record), bytes(body)


@settings(max_examples=1500, deadline=None)
@given(damaged())
def test_what_the_reader_reads_of_any_bytes_fastavro_reads_the_same(case: tuple[type, bytes]) -> None:
    cls, body = case
    reader = direct_reader(cls)
    try:
        value, end = reader(body, 0)
    except Exception:
        return  # left to fastavro: the codec reports its verdict, as before
    assert fastavro_read(cls, body, 0) == (value, end)


@given(st.integers(-(2**63), 2**63 - 1), st.binary(max_size=3))
def test_a_long_is_read_as_fastavro_reads_it(value: int, before: bytes) -> None:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, "long", value)
    data = before + out.getvalue() + b"\x07"
    assert read_long(data, len(before)) == (value, len(data) - 1)


@pytest.mark.parametrize("data", [
    b"\xff" * 10 + b"\x01",  # more than ten bytes
    b"\xff" * 9 + b"\x7f",  # ten bytes, past 64 bits
])
def test_a_long_too_long_is_not_read(data: bytes) -> None:
    with pytest.raises(NotReadable):
        read_long(data, 0)


def _framed(cls: type, body: bytes) -> bytes:
    return default_codec()._class(cls).single_object_header + body


def test_hostile_lengths_and_tags_are_left_to_fastavro_and_refused_as_before() -> None:
    block = r.TextBlock("hi")
    body = _body(block)  # a string: its zig-zag length (2 -> 4), then the text
    assert body == b"\x04hi"
    reader = direct_reader(r.TextBlock)
    hostile = [
        b"\x03hi",  # a negative length
        b"\x06hi",  # longer than what is there
        b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01" + b"hi",  # 2^63 - 1 bytes claimed
        b"\x04\xff\xfe",  # not UTF-8
    ]
    for data in hostile:
        with pytest.raises((NotReadable, IndexError, UnicodeDecodeError)):
            reader(data, 0)
        with pytest.raises(DecodeError):
            default_codec().decode("t", _framed(r.TextBlock, data), r.TextBlock)


def test_an_array_claiming_more_items_than_bytes_stops_at_once() -> None:
    record = r.ToolResult(call_id="c", request_id="q", ok=True, content=(), subscription=False)
    body = _body(record)
    empty = b"\x00"  # the content array's end, after the ids and `ok`
    at = body.index(empty, 5)
    huge = b"\xfe\xff\xff\xff\xff\xff\xff\xff\x7f"  # a block of 2^62 - 1 items
    data = body[:at] + huge + body[at + 1:]
    with pytest.raises(NotReadable):
        direct_reader(r.ToolResult)(data, 0)
    with pytest.raises(DecodeError):
        default_codec().decode("t", _framed(r.ToolResult, data), r.ToolResult)


def test_trailing_bytes_are_refused_as_before() -> None:
    data = _framed(r.TextBlock, _body(r.TextBlock("hi")) + b"\x00")
    with pytest.raises(DecodeError, match="trailing"):
        default_codec().decode("t", data, r.TextBlock)


def test_schemas_outside_the_subset_are_refused() -> None:
    mapped = fastavro.parse_schema({"type": "record", "name": "torpor.TextBlock", "fields": [
        {"name": "text", "type": {"type": "map", "values": "string"}}]}, named_schemas={})
    nulls = fastavro.parse_schema({"type": "record", "name": "torpor.TextBlock", "fields": [
        {"name": "text", "type": {"type": "array", "items": "null"}}]}, named_schemas={})
    other = fastavro.parse_schema({"type": "record", "name": "torpor.Usage", "fields": [
        {"name": "text", "type": "string"}]}, named_schemas={})
    renamed = fastavro.parse_schema({"type": "record", "name": "torpor.TextBlock", "fields": [
        {"name": "words", "type": "string"}]}, named_schemas={})
    for parsed in (mapped, nulls, other, renamed):
        assert isinstance(parsed, dict)
        with pytest.raises(NotReadable):
            record_reader(parsed, r.TextBlock)
