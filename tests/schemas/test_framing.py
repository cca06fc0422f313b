"""Framing headers and the CRC-64-AVRO fingerprint."""

from __future__ import annotations

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from torpor.schemas import framing
from torpor.schemas.codec import shipped_catalog
from torpor.schemas.errors import DecodeError


def test_fingerprints_match_the_avro_specification_vectors() -> None:
    # Java's SchemaNormalization.parsingFingerprint64("int") is 0x7275d51a3f395c8f;
    # the single-object header carries it little-endian.
    assert framing.crc64_avro(b'"int"').hex() == "8f5c393f1ad57572"


def test_fingerprints_of_the_shipped_schemas_agree_with_fastavro() -> None:
    for known in shipped_catalog().current.values():
        canonical = fastavro.schema.to_parsing_canonical_form(known.schema)
        assert known.fingerprint.hex() == fastavro.schema.fingerprint(canonical, "CRC-64-AVRO")


@given(st.binary(min_size=8, max_size=8), st.binary(max_size=20))
def test_a_single_object_header_reads_back(fingerprint: bytes, body: bytes) -> None:
    frame = framing.unframe(framing.single_object_header(fingerprint) + body)
    assert frame == framing.SingleObjectFrame(fingerprint)
    assert frame.body_offset == 10


@given(st.integers(0, 2**32 - 1), st.binary(max_size=20))
def test_a_confluent_header_reads_back(schema_id: int, body: bytes) -> None:
    frame = framing.unframe(framing.confluent_header(schema_id) + body)
    assert frame == framing.ConfluentFrame(schema_id)
    assert frame.body_offset == 5


def test_a_confluent_header_is_big_endian() -> None:
    assert framing.confluent_header(0x01020304) == b"\x00\x01\x02\x03\x04"


@given(st.binary())
def test_unframe_either_returns_a_frame_or_raises_a_decode_error(data: bytes) -> None:
    try:
        frame = framing.unframe(data, topic="t", partition=0, offset=1)
    except DecodeError as err:
        assert err.topic == "t" and err.offset == 1
    else:
        assert data[: 2 if isinstance(frame, framing.SingleObjectFrame) else 1] in (b"\xc3\x01", b"\x00")


def test_a_fingerprint_is_eight_bytes() -> None:
    with pytest.raises(ValueError, match="8 bytes"):
        framing.single_object_header(b"\x00")
