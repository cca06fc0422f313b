"""The codec: round trips in both framings, canonical bytes, and loud decode errors."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.schemas import strategies as s
from torpor.schemas import framing
from torpor.schemas import records as r
from torpor.schemas.codec import (
    Codec,
    canonical_bytes,
    decode_value,
    default_codec,
    encode_value,
    schema_for,
)
from torpor.schemas.errors import ContractError, DecodeError, SchemaMismatchError
from torpor.schemas.registry import SchemaRegistry

TOPIC = "torpor.inputs"
PARTITION = 3
OFFSET = 42

# One registry client for the module: the mock registry keeps its schemas per client.
REGISTRY = SchemaRegistry.from_url("mock://test-codec")
WITH_REGISTRY = Codec(REGISTRY)

HELLO = r.Input(
    message_id="m-1",
    thread_id="t-1",
    created_at=1_700_000_000_000,
    source="user:alice",
    expires_at=None,
    key_id=None,
    signature=None,
    body=r.UserMessage((r.TextBlock("hello"),)),
)

top_level_records = st.one_of(list(s.TOP_LEVEL.values()))


@settings(max_examples=300)
@given(top_level_records)
def test_every_top_level_record_round_trips_through_single_object_encoding(record: object) -> None:
    data = encode_value(record)
    assert data[:2] == framing.SINGLE_OBJECT_MAGIC
    decoded = decode_value(data, type(record))
    assert decoded == record
    # Deterministic: re-encoding the decoded record gives the same bytes.
    assert encode_value(decoded) == data


@settings(max_examples=300)
@given(top_level_records)
def test_every_top_level_record_round_trips_through_the_confluent_wire_format(record: object) -> None:
    topic = f"torpor.{type(record).__name__.lower()}"
    data = WITH_REGISTRY.encode(topic, record)
    assert data[:1] == framing.CONFLUENT_MAGIC
    assert WITH_REGISTRY.decode(topic, data, type(record)) == record


@given(s.inputs())
def test_canonical_bytes_are_the_single_object_body(record: r.Input) -> None:
    body = canonical_bytes(record)
    assert encode_value(record) == framing.single_object_header(schema_for(r.Input).fingerprint) + body
    assert default_codec().decode_body(body, 0, schema_for(r.Input), r.Input) == record


@given(s.records(r.ToolCall), s.records(r.Capability), s.records(r.ThreadConfig))
def test_nested_records_have_canonical_bytes_and_round_trip_on_their_own(
    call: r.ToolCall, capability: r.Capability, config: r.ThreadConfig
) -> None:
    for record in (call, capability, config):
        assert decode_value(encode_value(record), type(record)) == record
        assert canonical_bytes(record) == encode_value(record)[framing.SINGLE_OBJECT_HEADER_LEN :]


def test_canonical_bytes_of_a_known_input_are_pinned() -> None:
    # A client in another language can check its encoder against these bytes. If this
    # changes, the hash chain of every stored history changes with it.
    expected = (
        "066d2d31"  # message_id "m-1"
        "06742d31"  # thread_id "t-1"
        "80a0abfef962"  # created_at 1700000000000 (zigzag varint)
        "14757365723a616c696365"  # source "user:alice"
        "000000"  # expires_at, key_id, signature: null
        "02"  # body: union branch 1, UserMessage
        "0200"  # content: 1 item, branch 0, TextBlock
        "0a68656c6c6f"  # text "hello"
        "00"  # end of the array
    )
    assert canonical_bytes(HELLO).hex() == expected
    assert schema_for(r.Input).fingerprint.hex() == "09f653ad6191e06a"


def test_a_thinking_block_and_a_text_block_keep_their_branch() -> None:
    # Same leading field `text`: the branch is chosen by name, never guessed.
    completion = r.Completion(
        request_id="q",
        content=(r.ThinkingBlock("hmm", None), r.TextBlock("hmm")),
        tool_calls=(),
        usage=r.Usage(1, 2, 3),
        model="m",
        error=None,
    )
    assert decode_value(encode_value(completion), r.Completion) == completion


def test_one_codec_reads_both_framings_on_the_same_topic() -> None:
    plain = encode_value(HELLO)
    confluent = WITH_REGISTRY.encode(TOPIC, HELLO)
    assert plain != confluent
    for data in (plain, confluent):
        assert WITH_REGISTRY.decode(TOPIC, data, r.Input) == HELLO


def test_the_registry_path_registers_the_schema_once_under_topic_value() -> None:
    codec = Codec(SchemaRegistry.from_url("mock://test-codec-subjects"))
    first = codec.encode("torpor.receipts-probe", HELLO)
    second = codec.encode("torpor.receipts-probe", HELLO)
    assert first == second
    assert codec.registry is not None
    client = codec.registry._client
    assert client.get_subjects() == ["torpor.receipts-probe-value"]
    latest = client.get_latest_version("torpor.receipts-probe-value")
    assert latest.version == 1
    assert latest.schema_id == int.from_bytes(first[1:5], "big")
    assert latest.schema.schema_str == schema_for(r.Input).text


def _assert_names_the_place(err: DecodeError) -> None:
    assert (err.topic, err.partition, err.offset) == (TOPIC, PARTITION, OFFSET)
    assert f"topic={TOPIC} partition={PARTITION} offset={OFFSET}" in str(err)


@pytest.mark.parametrize(
    ("data", "cause"),
    [
        (b"", "empty value"),
        (b"\x01\x02\x03", "unknown magic bytes 0102"),
        (b"\xc3\x01\x00\x01", "truncated single-object header"),
        (b"\x00\x00\x01", "truncated Confluent header"),
        (b"\xc3\x01" + b"\x00" * 8 + b"\x02", "unknown schema fingerprint 0000000000000000"),
        (framing.confluent_header(7) + b"\x02", "no schema registry is configured"),
    ],
)
def test_bad_framing_raises_a_decode_error_naming_topic_partition_offset(data: bytes, cause: str) -> None:
    with pytest.raises(DecodeError) as caught:
        decode_value(data, r.Input, topic=TOPIC, partition=PARTITION, offset=OFFSET)
    _assert_names_the_place(caught.value)
    assert cause in caught.value.cause


def test_an_unknown_schema_id_raises_a_decode_error() -> None:
    data = framing.confluent_header(9999) + canonical_bytes(HELLO)
    with pytest.raises(DecodeError, match="unknown schema id 9999") as caught:
        WITH_REGISTRY.decode(TOPIC, data, r.Input, partition=PARTITION, offset=OFFSET)
    _assert_names_the_place(caught.value)


@settings(max_examples=50)
@given(s.inputs(), st.data())
def test_any_truncated_body_raises_a_decode_error(record: r.Input, data: st.DataObject) -> None:
    full = encode_value(record)
    cut = data.draw(st.integers(framing.SINGLE_OBJECT_HEADER_LEN, len(full) - 1))
    with pytest.raises(DecodeError) as caught:
        decode_value(full[:cut], r.Input, topic=TOPIC, partition=PARTITION, offset=OFFSET)
    _assert_names_the_place(caught.value)


def test_trailing_bytes_raise_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="1 trailing bytes") as caught:
        decode_value(encode_value(HELLO) + b"\x00", r.Input, topic=TOPIC, partition=PARTITION, offset=OFFSET)
    _assert_names_the_place(caught.value)


def test_a_union_branch_index_out_of_range_raises_a_decode_error() -> None:
    # UserMessage body: array count 1, branch index, "x", end of array.
    good = canonical_bytes(r.UserMessage((r.TextBlock("x"),)))
    assert good == b"\x02\x00\x02x\x00"
    header = framing.single_object_header(schema_for(r.UserMessage).fingerprint)
    bad = header + b"\x02\x0a\x02x\x00"  # branch 5 of a two-branch union
    with pytest.raises(DecodeError) as caught:
        decode_value(bad, r.UserMessage, topic=TOPIC, partition=PARTITION, offset=OFFSET)
    _assert_names_the_place(caught.value)


def test_decoding_as_the_wrong_record_class_raises_a_decode_error() -> None:
    with pytest.raises(DecodeError, match=r"torpor\.Input body does not decode as Dispatch"):
        decode_value(encode_value(HELLO), r.Dispatch, topic=TOPIC)


def test_encoding_a_record_that_does_not_fit_its_schema_raises_a_contract_error() -> None:
    bad = r.TextBlock(text=17)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match="TextBlock does not fit its schema"):
        encode_value(bad)


def test_encoding_a_class_without_a_schema_raises_a_contract_error() -> None:
    with pytest.raises(ContractError, match="no Avro schema named 'ConfluentFrame'"):
        canonical_bytes(framing.ConfluentFrame(1))


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1])
def test_an_int_outside_avro_long_is_a_contract_error(value: int) -> None:
    with pytest.raises(ContractError, match="Usage does not fit its schema"):
        encode_value(r.Usage(value, 0, 0))


def test_a_string_that_is_not_unicode_text_is_a_contract_error() -> None:
    with pytest.raises(ContractError, match="surrogates not allowed"):
        encode_value(r.TextBlock("\udc80"))


def test_invalid_utf8_in_a_body_is_a_decode_error() -> None:
    data = encode_value(r.TextBlock("ab")).replace(b"ab", b"\xff\xfe")
    with pytest.raises(DecodeError, match="UnicodeDecodeError"):
        decode_value(data, r.TextBlock, topic=TOPIC)


@dataclasses.dataclass(frozen=True, slots=True)
class Dispatch:
    """Not the wire record: an effect-like class that happens to share its name."""

    request_id: str


def test_a_same_named_class_of_another_shape_is_a_schema_mismatch() -> None:
    with pytest.raises(SchemaMismatchError, match=r"do not match schema torpor\.Dispatch"):
        canonical_bytes(Dispatch("q"))
    with pytest.raises(SchemaMismatchError):
        decode_value(encode_value(HELLO), Dispatch)
