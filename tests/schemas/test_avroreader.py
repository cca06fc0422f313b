"""The direct Avro reader reads exactly what fastavro reads, and leaves to fastavro what it cannot.

The reader is trusted with bytes from anyone who can write to a topic: whatever it returns
a value for, fastavro (and the conversion plan) must return the same value for, ending at
the same byte; everything else must go back to fastavro, whose verdict the codec reports.
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

import fastavro
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.schemas import evolved
from tests.schemas.strategies import records
from torpor.schemas import codec as codec_module
from torpor.schemas import records as r
from torpor.schemas.avroreader import NotReadable, read_long, record_reader
from torpor.schemas.codec import Catalog, Codec, default_codec, shipped_catalog
from torpor.schemas.errors import DecodeError

TOP_LEVEL = (r.Input, r.Dispatch, r.ThreadEvent, r.Receipt, r.HistoryEntry)
HI = r.Input("m", "t", 1_700_000_000_000, "user:a", None, None, None, r.UserMessage((r.TextBlock("hi"),)))


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
    # By repr: a flipped byte can make a double NaN, which is not equal to itself.
    read, stop = fastavro_read(cls, body, 0)
    assert (repr(read), stop) == (repr(value), end)


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


def _verdict(codec: Codec, cls: type, data: bytes) -> str:
    try:
        return repr(codec.decode("t", data, cls))
    except DecodeError as error:  # without the addresses of objects its reason may name
        return "DecodeError: " + re.sub(r" at 0x[0-9a-f]+", "", str(error))


def _fastavro_only(monkeypatch: pytest.MonkeyPatch) -> Codec:
    """A codec as it was before the direct reader: fastavro reads everything."""
    def refuse(parsed: object, cls: type) -> object:
        raise NotReadable("off")

    with monkeypatch.context() as patch:
        patch.setattr(codec_module, "record_reader", refuse)
        codec = Codec()
        for cls in (*TOP_LEVEL, r.ToolResult, r.TextBlock, r.ThreadConfig):
            codec._class(cls)
    return codec


TEXT = _body(r.ToolResult("c", "q", True, (r.TextBlock("hi"),), False))[6:-2]  # index, length, text


@pytest.mark.parametrize(("case", "body", "reads"), [
    ("boolean 2", b"\x02c\x02q\x02\x00\x00", False),
    ("boolean 0xff", b"\x02c\x02q\xff\x00\x00", False),
    ("a negative block, with its size", b"\x02c\x02q\x01\x01" + bytes([2 * len(TEXT)]) + TEXT + b"\x00\x00",
     False),
    ("two blocks of one item", b"\x02c\x02q\x01\x02" + TEXT + b"\x02" + TEXT + b"\x00\x00", True),
    ("a union index of -1", b"\x02c\x02q\x01\x02\x01" + TEXT[1:] + b"\x00\x00", False),
    ("a union index out of range", b"\x02c\x02q\x01\x02\x7e" + TEXT[1:] + b"\x00\x00", False),
    ("a length padded to ten bytes", b"\x82\x80\x80\x80\x80\x80\x80\x80\x80\x00c\x02q\x01\x00\x00", True),
    ("a length past 64 bits", b"\x82\x80\x80\x80\x80\x80\x80\x80\x80\x7fc\x02q\x01\x00\x00", False),
])
def test_odd_bodies_get_the_verdict_they_got_before(case: str, body: bytes, reads: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    reader = direct_reader(r.ToolResult)
    if reads:
        value, end = reader(body, 0)
        assert (value, end) == fastavro_read(r.ToolResult, body, 0), case
    else:
        with pytest.raises((NotReadable, IndexError)):
            reader(body, 0)
    data = _framed(r.ToolResult, body)
    assert _verdict(Codec(), r.ToolResult, data) == _verdict(_fastavro_only(monkeypatch), r.ToolResult, data)


@pytest.mark.parametrize("bits", [struct.pack("<d", math.nan), bytes.fromhex("010000000000f07f"),
                                  struct.pack("<d", -0.0), struct.pack("<d", math.inf)])
@settings(max_examples=20, deadline=None)
@given(config=records(r.ThreadConfig))
def test_a_double_of_any_bits_gets_the_verdict_it_got_before(bits: bytes, config: r.ThreadConfig) -> None:
    marker = struct.pack("<d", 0.515625)  # exact in binary, and found once in the body
    body = _body(dataclasses.replace(config, compaction_threshold=0.515625))
    assume(body.count(marker) == 1)
    data = _framed(r.ThreadConfig, body.replace(marker, bits))
    with pytest.MonkeyPatch.context() as patch:
        before = _verdict(_fastavro_only(patch), r.ThreadConfig, data)
    assert _verdict(Codec(), r.ThreadConfig, data) == before


def test_the_current_schema_is_read_without_fastavro(monkeypatch: pytest.MonkeyPatch) -> None:
    data = Codec().encode("t", HI)

    def no_fastavro(*args: object, **kwargs: object) -> object:
        raise AssertionError("fastavro read a body of the current schema")

    monkeypatch.setattr(fastavro, "schemaless_reader", no_fastavro)
    assert Codec().decode("t", data, r.Input) == HI


def test_an_older_writer_schema_is_still_resolved_by_fastavro(monkeypatch: pytest.MonkeyPatch) -> None:
    data = Codec().encode("t", HI)
    current = shipped_catalog().current["Input"].schema
    newer = Codec(catalog=Catalog.from_schemas([evolved.input_v2_schema()], writer_only=[current]))
    calls: list[object] = []
    resolve: Callable[..., object] = fastavro.schemaless_reader

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args[2])
        return resolve(*args, **kwargs)

    monkeypatch.setattr(fastavro, "schemaless_reader", counted)
    read = newer.decode("t", data, evolved.Input)
    assert read.body == evolved.UserMessage((evolved.TextBlock("hi", lang=None),)) and read.priority is None
    assert len(calls) == 1 and calls[0] is not None  # resolved against the reader's schema


@dataclass(frozen=True)
class Node:
    label: str
    next: Node | None


def test_a_record_that_holds_itself_is_left_to_fastavro() -> None:
    parsed = fastavro.parse_schema({"type": "record", "name": "torpor.Node", "fields": [
        {"name": "label", "type": "string"}, {"name": "next", "type": ["null", "torpor.Node"]}]},
        named_schemas={})
    assert isinstance(parsed, dict)
    with pytest.raises(NotReadable, match="holds itself"):
        record_reader(parsed, Node)


@dataclass(frozen=True)
class Usage:  # the name of a shipped record, another class
    tokens: str


@dataclass(frozen=True)
class Billed:
    mine: Usage
    shipped: r.Usage


def test_two_record_classes_of_one_name_are_left_to_fastavro() -> None:
    usage = {"type": "record", "name": "torpor.Usage", "fields": [{"name": "tokens", "type": "string"}]}
    parsed = fastavro.parse_schema({"type": "record", "name": "torpor.Billed", "fields": [
        {"name": "mine", "type": usage}, {"name": "shipped", "type": "torpor.Usage"}]}, named_schemas={})
    assert isinstance(parsed, dict)
    with pytest.raises(NotReadable, match="two record classes"):
        record_reader(parsed, Billed)


@pytest.mark.parametrize("envelope", [
    {"source": "processor"},  # a false source: the fold's verifier judges it, after decoding
    {"source": "tool:echo", "key_id": None, "signature": None},  # no signature
    {"message_id": "", "thread_id": ""},  # empty ids
    {"message_id": "m" * 200_000, "thread_id": "t" * 200_000, "source": "s" * 200_000},  # huge ids
    {"key_id": "k", "signature": b"\x00" * 64},  # a signature of nobody's
])
def test_an_envelope_of_any_claim_is_read_as_fastavro_reads_it(envelope: dict[str, object]) -> None:
    # The reader decides nothing about authority: it must give the verifier exactly the
    # envelope fastavro gave it, whatever the envelope claims.
    record = dataclasses.replace(HI, **envelope)  # type: ignore[arg-type]
    data = Codec().encode("t", record)
    header = len(data) - len(_body(record))
    assert direct_reader(r.Input)(data, header) == fastavro_read(r.Input, data, header) == (record, len(data))
    assert Codec().decode("t", data, r.Input) == record
