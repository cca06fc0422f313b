"""The direct Avro writer writes exactly fastavro's bytes, and leaves to fastavro what it cannot."""

from __future__ import annotations

import dataclasses
import io

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.schemas.strategies import records
from torpor.schemas import records as r
from torpor.schemas.avrowriter import NotWritable, long_bytes, record_writer
from torpor.schemas.codec import canonical_bytes, default_codec
from torpor.schemas.errors import ContractError

TOP_LEVEL = (r.Input, r.Dispatch, r.ThreadEvent, r.Receipt, r.HistoryEntry)


def fastavro_bytes(record: object) -> bytes:
    codec = default_codec()._class(type(record))
    out = io.BytesIO()
    fastavro.schemaless_writer(out, codec.schema.parsed, codec.plan.to_avro(record))
    return out.getvalue()


@settings(max_examples=300, deadline=None)
@given(st.one_of([records(cls) for cls in TOP_LEVEL]))
def test_every_record_is_written_as_fastavro_writes_it(record: object) -> None:
    direct = default_codec()._class(type(record)).direct
    assert direct is not None  # every shipped schema is within what the writer writes
    assert direct(record) == fastavro_bytes(record)
    assert canonical_bytes(record) == fastavro_bytes(record)


@given(st.integers(-(2**63), 2**63 - 1))
def test_a_long_is_zigzag_varint_as_fastavro_writes_it(value: int) -> None:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, "long", value)
    assert long_bytes(value) == out.getvalue()


@pytest.mark.parametrize("value", [63, 64, -64, -65, 2**55 - 1, 2**55, -(2**55), -(2**55) - 1,
                                   2**62, -(2**62) - 1, 2**63 - 1, -(2**63)])
def test_a_long_at_each_edge_of_the_fast_path_is_written_as_fastavro_writes_it(value: int) -> None:
    # `long_bytes` does machine-word arithmetic within 2**55 when compiled, and leaves the
    # range check to the slow path beyond it.
    out = io.BytesIO()
    fastavro.schemaless_writer(out, "long", value)
    assert long_bytes(value) == out.getvalue()


def test_a_long_out_of_range_is_not_written() -> None:
    for value in (2**63, -(2**63) - 1, 2**80):
        with pytest.raises(NotWritable):
            long_bytes(value)


def test_a_value_of_another_type_than_its_schema_is_left_to_fastavro() -> None:
    usage = r.Usage(input_tokens=1, output_tokens=2, total_tokens=3)
    direct = default_codec()._class(r.Usage).direct
    assert direct is not None
    for odd in (dataclasses.replace(usage, input_tokens=True),
                dataclasses.replace(usage, total_tokens=2**70)):
        with pytest.raises(NotWritable):
            direct(odd)
    # fastavro writes a bool as a long (1): the codec's bytes are fastavro's, as before.
    assert canonical_bytes(dataclasses.replace(usage, input_tokens=True)) == canonical_bytes(
        dataclasses.replace(usage, input_tokens=1))
    with pytest.raises(ContractError):  # and what fastavro refuses is refused as before
        canonical_bytes(dataclasses.replace(usage, total_tokens=2**70))
    with pytest.raises(ContractError):
        canonical_bytes(r.TextBlock("\ud800"))  # a lone surrogate is no UTF-8


def test_a_schema_outside_the_subset_is_refused() -> None:
    parsed = fastavro.parse_schema({"type": "record", "name": "torpor.M", "fields": [
        {"name": "m", "type": {"type": "map", "values": "string"}}]}, named_schemas={})
    assert isinstance(parsed, dict)
    with pytest.raises(NotWritable):
        record_writer(parsed)
