"""Interoperability with the Apache Avro reference library (Python), as another client sees us.

Apache Avro parses every `.avsc` strictly, reads the bytes Torpor writes, and computes
fingerprints; where its Parsing Canonical Form keeps logical types (``{"type":"long"}``
instead of the specification's ``"long"``), Torpor's readers accept that fingerprint too.
"""

from __future__ import annotations

import io
import json

import avro.io
import avro.schema
import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.schemas import strategies as s
from torpor.schemas import framing
from torpor.schemas import records as r
from torpor.schemas.codec import TOP_LEVEL, canonical_bytes, decode_value, schema_for, shipped_catalog
from torpor.schemas.convert import plan_for

_examples: dict[str, object] = {
    "Input": r.Input("m", "t", 1, "user:u", 2, None, None, r.TimerFired("c", "q", 3)),
    "Dispatch": r.Dispatch("q", "t", "c", "tool", "{}", r.Capability("x", (), (), 9), 1, 5, 6, "invoke"),
    "ThreadEvent": r.ThreadEvent("e", "t", 7, "thread_created", False, None, None, None, None),
    "Receipt": r.Receipt(
        "rc", "t", "m", 0, 1, 8, "applied", None, "00", "11", 1, (), None, False, "verified", 0, "dev"
    ),
    "HistoryEntry": r.HistoryEntry(0, 9, "m", r.SummaryEntry("s", 0)),
}


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_apache_avro_parses_every_schema_file(name: str) -> None:
    parsed = avro.schema.parse(shipped_catalog().current[name].text)
    assert isinstance(parsed, avro.schema.RecordSchema) and parsed.fullname == f"torpor.{name}"


def test_our_canonical_form_and_its_variant_match_the_libraries() -> None:
    for known in shipped_catalog().current.values():
        assert framing.parsing_canonical_form(known.schema) == fastavro.schema.to_parsing_canonical_form(
            known.schema
        )
        apache = avro.schema.parse(known.text)
        assert framing.parsing_canonical_form(known.schema, logical_as_object=True) == apache.canonical_form


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_a_value_framed_with_apache_avros_fingerprint_still_decodes(name: str) -> None:
    known = shipped_catalog().current[name]
    apache_fp = avro.schema.parse(known.text).fingerprint("CRC-64-AVRO")
    assert apache_fp in (known.fingerprint, *known.also_known_as)
    record = _examples[name]
    data = framing.single_object_header(apache_fp) + canonical_bytes(record)
    assert decode_value(data, type(record)) == record


def _plain(datum: object) -> object:
    """Our writer datum as Apache Avro reads it back: lists, no union names."""
    if isinstance(datum, tuple):
        if len(datum) == 2 and isinstance(datum[0], str) and isinstance(datum[1], dict):
            return _plain(datum[1])
        return [_plain(d) for d in datum]
    if isinstance(datum, list):
        return [_plain(d) for d in datum]
    if isinstance(datum, dict):
        return {k: _plain(v) for k, v in datum.items()}
    return datum


def _without_logical_types(node: object) -> object:
    if isinstance(node, list):
        return [_without_logical_types(n) for n in node]
    if isinstance(node, dict):
        if "logicalType" in node:
            return node["type"]
        return {k: _without_logical_types(v) for k, v in node.items()}
    return node


_readers = {
    cls: avro.io.DatumReader(avro.schema.parse(json.dumps(_without_logical_types(schema_for(cls).schema))))
    for cls in s.TOP_LEVEL
}


@settings(max_examples=200)
@given(st.one_of(list(s.TOP_LEVEL.values())))
def test_apache_avro_reads_what_torpor_writes(record: object) -> None:
    body = canonical_bytes(record)
    read = _readers[type(record)].read(avro.io.BinaryDecoder(io.BytesIO(body)))
    assert read == _plain(plan_for(type(record)).to_avro(record))
