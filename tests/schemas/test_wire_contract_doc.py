"""docs/wire-contract.md is true: its vectors are what Torpor computes, its rules are the code's.

The vectors live in docs/wire-contract-vectors.json, which the Java example's tests read
too (`WireContractTest`, run by tests/examples/test_java_example.py): each one is
recomputed here with Torpor's own code, and the guide must show each one as the JSON has
it (tables by row, annotated byte dumps by their bytes). The rules the guide states
(topic names, magic bytes, domain tags, the id pattern, what changes a fingerprint) are
checked against the code, and every test the guide names must exist.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from torpor.schemas import framing, ids, signing
from torpor.schemas import records as r
from torpor.schemas.codec import canonical_bytes, decode_value, encode_value, shipped_catalog
from torpor.schemas.ids import derive_id
from torpor.schemas.signer import public_key_bytes
from torpor.streams.config import TopicSettings
from torpor.streams.partitioner import murmur2, partition_for
from torpor.streams.topics import Topic

REPO: Final = Path(__file__).resolve().parents[2]
GUIDE: Final = (REPO / "docs" / "wire-contract.md").read_text(encoding="utf-8")
VECTORS: Final = json.loads((REPO / "docs" / "wire-contract-vectors.json").read_text(encoding="utf-8"))


def _section(marker: str) -> str:
    """The guide's text from `<!-- marker -->` to the next marker or heading."""
    start = GUIDE.index(f"<!-- {marker} -->")
    ends = [i for i in (GUIDE.find("<!--", start + 1), GUIDE.find("\n#", start)) if i != -1]
    return GUIDE[start:min(ends, default=len(GUIDE))]


def _dump(marker: str) -> str:
    """The bytes of an annotated dump (a fenced block): hex with `#` comments, as one hex string."""
    block = _section(f"vector: {marker}").split("```")[1]
    return "".join("".join(line.split("#", 1)[0].split()) for line in block.splitlines())


def _vector_input() -> r.Input:
    v = VECTORS["signing"]["input"]
    body = v["body"]["ToolResult"]
    return r.Input(
        message_id=v["message_id"], thread_id=v["thread_id"], created_at=v["created_at"], source=v["source"],
        expires_at=v["expires_at"], key_id=None, signature=None,
        body=r.ToolResult(call_id=body["call_id"], request_id=body["request_id"], ok=body["ok"],
                          content=tuple(r.TextBlock(b["TextBlock"]["text"]) for b in body["content"]),
                          subscription=body["subscription"]))


def test_the_vectors_are_what_torpor_computes() -> None:
    fp = VECTORS["fingerprint"]
    header = framing.crc64_avro(framing.parsing_canonical_form(json.loads(fp["schema"])).encode())
    assert header.hex() == fp["header"]
    assert int.from_bytes(header, "little") == int(fp["value"], 16)  # little-endian, not Java's default

    catalog = shipped_catalog().current
    shipped = {k: v for k, v in VECTORS["shipped_fingerprints"].items() if k != "about"}
    assert shipped == {name: catalog[name].fingerprint.hex() for name in shipped}, (
        "a schema changed: update docs/wire-contract-vectors.json and the guide's table "
        "(and keep the old file in torpor/schemas/history/)")

    for v in VECTORS["ids"]:
        assert derive_id(*v["args"]) == v["id"]
    for v in VECTORS["partitions"]:
        key = v["key"].encode("utf-8")
        computed = (murmur2(key), partition_for(key, 6), partition_for(key, 7))
        assert computed == (v["murmur2"], v["of_6"], v["of_7"])

    s = VECTORS["signing"]
    key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(s["seed"]))
    assert public_key_bytes(key).hex() == s["public_key"]
    record = _vector_input()
    assert canonical_bytes(record.body).hex() == s["body_bytes"]
    assert signing.signing_bytes(dataclasses.replace(record, key_id=s["key_id"])).hex() == s["signing_bytes"]
    signed = signing.sign(record, s["key_id"], key)
    assert signed.signature is not None and signed.signature.hex() == s["signature"]
    assert encode_value(signed).hex() == s["single_object"]
    assert decode_value(bytes.fromhex(s["single_object"]), r.Input) == signed


def test_the_guide_shows_the_vectors() -> None:
    fp = VECTORS["fingerprint"]
    assert f"| `{fp['schema']}` | `{fp['value']}` | `{fp['header']}` |" in _section("vector: fingerprint")
    table = _section("vector: shipped_fingerprints")
    for name, value in VECTORS["shipped_fingerprints"].items():
        if name != "about":
            assert f"| `{name}.avsc` | `{value}` |" in table
    table = _section("vector: ids")
    for v in VECTORS["ids"]:
        call = ", ".join(json.dumps(a, ensure_ascii=False) for a in v["args"])
        assert f"| `derive_id({call})` | `{v['id']}` |" in table
    table = _section("vector: partitions")
    for v in VECTORS["partitions"]:
        assert f"| `{v['key']}` | {v['murmur2']} | {v['of_6']} | {v['of_7']} |" in table
    s = VECTORS["signing"]
    for marker in ("body_bytes", "signing_bytes", "single_object"):
        assert _dump(marker) == s[marker], marker
    assert f"`{s['signature']}`" in _section("vector: signature")
    assert f"seed `{s['seed']}`" in GUIDE and f"public key `{s['public_key']}`" in GUIDE
    assert f"key id\n`{s['key_id']}`" in GUIDE


def test_the_topic_table_names_every_topic() -> None:
    rows = [line for line in _section("claim: topics").splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [t.value for t in Topic]
    assert f"defaults to `{TopicSettings().prefix}`" in GUIDE


def test_the_rules_stated_are_the_codes() -> None:
    table = _section("claim: framing")
    assert "`C3 01`" in table
    assert bytes.fromhex("C301") == framing.SINGLE_OBJECT_MAGIC
    assert "`00`, then the registry's 4-byte schema id, **big-endian**" in table
    assert framing.confluent_header(1) == bytes.fromhex("0000000001")
    pattern, _, length = ids.ID_PATTERN.pattern.partition("{")
    assert f"1 to {ids.MAX_ID_LENGTH} characters of\n`{pattern}`" in _section("claim: wire ids")
    assert length == f"1,{ids.MAX_ID_LENGTH}}}"
    assert f'SHA-256("{ids.DOMAIN.decode()}"' in GUIDE and f"[:{ids.HEX_DIGITS}]" in GUIDE
    assert '"torpor-input-v1\\0"' in GUIDE and signing.DOMAIN == b"torpor-input-v1\x00"


def _fingerprint(schema: object) -> str:
    return framing.crc64_avro(framing.parsing_canonical_form(schema).encode()).hex()


def _without(node: object, keys: set[str]) -> object:
    if isinstance(node, list):
        return [_without(n, keys) for n in node]
    if isinstance(node, dict):
        if "logicalType" in keys and "logicalType" in node and isinstance(node.get("type"), str):
            return node["type"]
        return {k: _without(v, keys) for k, v in node.items() if k not in keys}
    return node


def test_what_changes_a_fingerprint_is_what_the_guide_says() -> None:
    shipped = shipped_catalog().current["Input"].schema
    assert _fingerprint(shipped) == VECTORS["shipped_fingerprints"]["Input"]
    for dropped in ({"doc"}, {"default"}, {"logicalType"}):
        assert _fingerprint(_without(shipped, dropped)) == _fingerprint(shipped), dropped
    added = copy.deepcopy(shipped)
    fields = added["fields"]
    assert isinstance(fields, list)
    fields.append({"name": "priority", "type": ["null", "long"], "default": None})
    swapped = copy.deepcopy(shipped)
    order = swapped["fields"]
    assert isinstance(order, list)
    order[0], order[1] = order[1], order[0]
    assert _fingerprint(added) != _fingerprint(shipped) and _fingerprint(swapped) != _fingerprint(shipped)


def test_every_test_the_guide_names_exists() -> None:
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", GUIDE)
    assert len(named) > 20
    for path, name in named:
        assert re.search(rf"^def {name}\(", (REPO / path).read_text(), re.MULTILINE), f"{path}::{name}"
    java = REPO / "examples" / "java" / "src" / "test" / "java" / "example" / "torpor"
    assert "class WireContractTest" in (java / "WireContractTest.java").read_text()


def test_the_readme_and_the_connector_guide_point_to_it() -> None:
    assert "[docs/wire-contract.md](docs/wire-contract.md)" in (REPO / "README.md").read_text()
    assert "[wire-contract.md](wire-contract.md)" in (REPO / "docs" / "connectors.md").read_text()
