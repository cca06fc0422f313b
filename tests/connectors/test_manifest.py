"""Toolset manifests: the JSON form, its version, and a connector publishing it to `toolsets`."""

from __future__ import annotations

import dataclasses
import json
import signal

import pytest

from tests.processors.test_processor import TORPOR, Deployment, deployment
from tests.waiting import wait_until
from torpor.connectors.echo import ECHO_SPEC
from torpor.connectors.manifest import (
    Manifest,
    canonical_spec,
    decode_manifest,
    encode_manifest,
    manifests,
    publish_manifest,
    read_toolsets,
)
from torpor.connectors.subscriptions import WATCH_SPEC
from torpor.connectors.timers import TIMER_SPEC
from torpor.schemas.errors import ConfigError, DecodeError
from torpor.streams.config import KafkaSettings, Settings, TopicSettings

__all__ = ["deployment"]  # the fixture, shared with test_processor

SCHEMA_SPEC = dataclasses.replace(ECHO_SPEC, name="count", result_schema=json.dumps({"type": "integer"}))


def test_one_manifest_per_toolset_and_it_round_trips() -> None:
    found = manifests((ECHO_SPEC, TIMER_SPEC, WATCH_SPEC, SCHEMA_SPEC), source="connector:mixed")
    assert [(m.toolset, [s.name for s in m.specs]) for m in found] == [
        ("builtin", ["timer"]), ("local", ["echo", "watch", "count"])]
    for manifest in found:
        decoded = decode_manifest(encode_manifest(manifest))
        canonical = tuple(canonical_spec(s) for s in manifest.specs)
        assert decoded == dataclasses.replace(manifest, specs=canonical)
    document = json.loads(encode_manifest(found[1]))
    assert document["tools"][0]["parameters"]["required"] == ["text"]  # a JSON object, not a string
    assert document["tools"][2]["result_schema"] == {"type": "integer"}


def test_the_version_changes_exactly_when_a_tool_does() -> None:
    (first,) = manifests((ECHO_SPEC,), source="connector:echo")
    (same,) = manifests((ECHO_SPEC,), source="connector:elsewhere")
    (changed,) = manifests((dataclasses.replace(ECHO_SPEC, description="Repeat."),), source="connector:echo")
    assert first.version == same.version != changed.version


@pytest.mark.parametrize("value", [b"not json", b"{}", b'{"toolset": "x", "tools": [{}]}'])
def test_a_value_that_is_not_a_manifest_is_a_decode_error(value: bytes) -> None:
    with pytest.raises(DecodeError, match="not a toolset manifest"):
        decode_manifest(value)


@pytest.mark.kafka
def test_a_connector_publishes_its_toolset_at_start(deployment: Deployment) -> None:
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=deployment.bootstrap),
                        topics=TopicSettings(prefix=deployment.prefix))
    assert read_toolsets(settings) == {}
    echo = deployment.start([TORPOR, "connector", "run-echo", "--group", f"echo-{deployment.prefix}",
                             "--journal-dir", str(deployment.root / "journal")], "echo")
    found: dict[str, Manifest] = {}

    def published() -> bool:
        found.update(read_toolsets(settings))
        return "local" in found

    wait_until(published, timeout=60, message=lambda: f"the manifest; echo log:\n"
                                                      f"{deployment.log('echo')[-2000:]}")
    assert found["local"].specs == (canonical_spec(ECHO_SPEC),)
    assert found["local"].source == "connector:echo"
    echo.send_signal(signal.SIGTERM)
    assert echo.wait(timeout=60) == 0


BACKREFERENCE = {"type": "object", "properties": {"t": {"pattern": "(a)\\1"}}}
BACKREFERENCE_SPEC = dataclasses.replace(ECHO_SPEC, name="bad", parameters=json.dumps(BACKREFERENCE))


def test_publishing_an_invalid_spec_is_a_config_error_and_nothing_is_produced() -> None:
    produced: list[bytes] = []

    class Recorder:
        def produce(self, topic: str, key: bytes, value: bytes) -> None:
            produced.append(value)

    with pytest.raises(ConfigError, match="cannot publish tool 'bad': parameters: pattern"):
        publish_manifest(Recorder(), "toolsets", (ECHO_SPEC, BACKREFERENCE_SPEC),  # type: ignore[arg-type]
                         source="connector:echo")
    assert produced == []


def test_reading_a_manifest_skips_an_invalid_spec_and_names_it() -> None:
    (manifest,) = manifests((ECHO_SPEC,), source="connector:echo")
    document = json.loads(encode_manifest(manifest))
    deep = json.loads("[" * 30 + "]" * 30)
    document["tools"].append({**document["tools"][0], "name": "bad", "parameters": BACKREFERENCE})
    document["tools"].append({**document["tools"][0], "name": "deep", "parameters": deep})
    decoded = decode_manifest(json.dumps(document).encode())
    assert [s.name for s in decoded.specs] == ["echo"]
    assert [why.split(":")[0] for why in decoded.skipped] == ["bad", "deep"]


def test_a_manifest_nested_too_deep_is_a_decode_error_not_a_crash() -> None:
    with pytest.raises(DecodeError, match="nested deeper"):
        decode_manifest(b"[" * 50_000 + b"]" * 50_000)
