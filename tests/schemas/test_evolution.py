"""Schema evolution: old readers read new data and new readers read old data.

The fixture is `evolved.py`: version 2 of `Input` adds an optional envelope field and an
optional field deep inside `TextBlock`. Each direction is checked through both framings:
the registry path (writer schema fetched by id) and the single-object path (writer schema
found by fingerprint among the schemas the reader holds). A body branch the reader does
not know is a `DecodeError`, and the compatibility checker tells the two changes apart.
"""

from __future__ import annotations

import io
import json
from importlib import resources

import fastavro
import pytest

from tests.schemas import evolved
from tests.schemas.compat import compatibility_problems
from torpor.schemas import framing
from torpor.schemas import records as r
from torpor.schemas.codec import TOP_LEVEL, Catalog, Codec, make_known, shipped_catalog
from torpor.schemas.errors import DecodeError
from torpor.schemas.registry import SchemaRegistry

TOPIC = "torpor.inputs"

V1 = shipped_catalog().current["Input"].schema
V2 = evolved.input_v2_schema()

OLD_RECORD = r.Input(
    "m-old", "t", 1_700_000_000_000, "user:a", None, None, None, r.UserMessage((r.TextBlock("hi"),))
)
NEW_RECORD = evolved.Input(
    "m-new",
    "t",
    1_700_000_000_001,
    "user:a",
    None,
    None,
    None,
    evolved.UserMessage((evolved.TextBlock("hallo", lang="de"),)),
    priority=7,
)
NEW_AS_OLD = r.Input(
    "m-new", "t", 1_700_000_000_001, "user:a", None, None, None, r.UserMessage((r.TextBlock("hallo"),))
)
OLD_AS_NEW = evolved.Input(
    "m-old",
    "t",
    1_700_000_000_000,
    "user:a",
    None,
    None,
    None,
    evolved.UserMessage((evolved.TextBlock("hi", lang=None),)),
    priority=None,
)

# A build with v2 as its current Input, still holding v1 as a known writer schema.
NEW_CATALOG = Catalog.from_schemas([V2], writer_only=[V1])


def test_v2_is_backward_and_forward_compatible_with_v1() -> None:
    assert compatibility_problems(V1, V2) == []


def test_a_new_body_branch_is_backward_but_not_forward_compatible() -> None:
    problems = compatibility_problems(V1, evolved.input_with_new_branch_schema())
    assert problems == ["forward: Input.body: writer branch torpor.Snooze has no reader branch that reads it"]


def test_a_new_field_without_a_default_is_not_backward_compatible() -> None:
    required = json.loads(json.dumps(V1))
    required["fields"].append({"name": "priority", "type": "long", "doc": "no default"})
    assert compatibility_problems(V1, required) == [
        "backward: Input.priority: reader field missing from the writer has no default"
    ]


def test_every_shipped_historical_schema_is_compatible_with_the_current_one() -> None:
    history = resources.files("torpor.schemas") / "history"
    older = [p for p in history.iterdir() if p.name.endswith(".avsc")] if history.is_dir() else []
    current = shipped_catalog().current
    for path in older:
        old = json.loads(path.read_text(encoding="utf-8"))
        assert compatibility_problems(old, current[str(old["name"])].schema) == [], path.name


# Pinned fingerprints of the current top-level schemas. A change to a schema changes its
# fingerprint: then copy the previous version to `torpor/schemas/history/<Name>.v<N>.avsc`
# (so data written with it stays readable without a registry) and update the pin here.
PINNED = {
    "Input": "09f653ad6191e06a",
    "Dispatch": "df3133df0401a5ec",
    "ThreadEvent": "3715d4a07e861ab3",
    "Receipt": "05e7af42d772e6e0",
    "HistoryEntry": "f778c04ed324c69f",
}


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_a_changed_top_level_schema_keeps_its_previous_version_readable(name: str) -> None:
    catalog = shipped_catalog()
    fingerprint = catalog.current[name].fingerprint.hex()
    pinned = PINNED[name]
    if pinned != fingerprint:
        assert bytes.fromhex(pinned) in catalog.by_fingerprint, (
            f"{name}.avsc changed ({pinned} -> {fingerprint}) without its previous version in "
            "torpor/schemas/history/; add it there and update PINNED"
        )


# --- single-object encoding -----------------------------------------------------------


def test_single_object_new_reader_reads_old_data() -> None:
    old_data = Codec().encode(TOPIC, OLD_RECORD)
    assert Codec(catalog=NEW_CATALOG).decode(TOPIC, old_data, evolved.Input) == OLD_AS_NEW


def test_single_object_old_reader_reads_new_data_once_it_holds_the_new_schema() -> None:
    new_data = Codec(catalog=NEW_CATALOG).encode(TOPIC, NEW_RECORD)
    # Rolled out first: the old build holds v2 as a writer schema (schemas/history/ or
    # Catalog.with_writers) before any writer uses it.
    old_reader = Codec(catalog=shipped_catalog().with_writers([V2]))
    assert old_reader.decode(TOPIC, new_data, r.Input) == NEW_AS_OLD


def test_single_object_old_reader_without_the_new_schema_fails_loudly() -> None:
    new_data = Codec(catalog=NEW_CATALOG).encode(TOPIC, NEW_RECORD)
    with pytest.raises(DecodeError, match="unknown schema fingerprint") as caught:
        Codec().decode(TOPIC, new_data, r.Input, partition=1, offset=9)
    assert (caught.value.partition, caught.value.offset) == (1, 9)


# --- Confluent wire format --------------------------------------------------------------


def test_registry_new_reader_reads_old_data_and_old_reader_reads_new_data() -> None:
    registry = SchemaRegistry.from_url("mock://test-evolution")
    old_codec = Codec(registry)  # the shipped build: v1
    new_codec = Codec(registry, catalog=Catalog.from_schemas([V2]))  # v2; v1 only via the registry
    old_data = old_codec.encode(TOPIC, OLD_RECORD)
    new_data = new_codec.encode(TOPIC, NEW_RECORD)
    assert old_data[1:5] != new_data[1:5]  # two schema ids under one subject
    assert new_codec.decode(TOPIC, old_data, evolved.Input) == OLD_AS_NEW
    assert old_codec.decode(TOPIC, new_data, r.Input) == NEW_AS_OLD
    # And each still reads its own.
    assert old_codec.decode(TOPIC, old_data, r.Input) == OLD_RECORD
    assert new_codec.decode(TOPIC, new_data, evolved.Input) == NEW_RECORD


# --- an unknown union branch ----------------------------------------------------------------


def _snooze_body(schema: dict[str, object]) -> bytes:
    known = make_known(schema)
    out = io.BytesIO()
    datum = {
        "message_id": "m-snooze",
        "thread_id": "t",
        "created_at": 5,
        "source": "user:a",
        "expires_at": None,
        "key_id": None,
        "signature": None,
        "body": ("torpor.Snooze", {"until": 9}),
    }
    fastavro.schemaless_writer(out, known.parsed, datum)
    return out.getvalue()


def test_an_unknown_body_branch_is_a_decode_error_in_both_framings() -> None:
    with_snooze = evolved.input_with_new_branch_schema()
    body = _snooze_body(with_snooze)

    single = framing.single_object_header(make_known(with_snooze).fingerprint) + body
    reader = Codec(catalog=shipped_catalog().with_writers([with_snooze]))
    with pytest.raises(DecodeError, match="does not resolve") as caught:
        reader.decode(TOPIC, single, r.Input, partition=2, offset=77)
    assert (caught.value.topic, caught.value.partition, caught.value.offset) == (TOPIC, 2, 77)

    registry = SchemaRegistry.from_url("mock://test-evolution-branch")
    schema_id = registry.register(f"{TOPIC}-value", json.dumps(with_snooze))
    with pytest.raises(DecodeError, match="does not resolve"):
        Codec(registry).decode(TOPIC, framing.confluent_header(schema_id) + body, r.Input, 2, 78)


def test_an_old_branch_written_with_the_new_schema_still_decodes() -> None:
    # Only records that use the new branch fail; the rest of the topic reads on.
    with_snooze = evolved.input_with_new_branch_schema()
    known = make_known(with_snooze)
    out = io.BytesIO()
    fastavro.schemaless_writer(
        out,
        known.parsed,
        {
            "message_id": "m",
            "thread_id": "t",
            "created_at": 5,
            "source": "user:a",
            "expires_at": None,
            "key_id": None,
            "signature": None,
            "body": ("torpor.UserMessage", {"content": [("torpor.TextBlock", {"text": "x"})]}),
        },
    )
    data = framing.single_object_header(known.fingerprint) + out.getvalue()
    reader = Codec(catalog=shipped_catalog().with_writers([with_snooze]))
    assert reader.decode(TOPIC, data, r.Input).body == r.UserMessage((r.TextBlock("x"),))
