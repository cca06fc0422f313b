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
    read_toolsets,
)
from torpor.connectors.subscriptions import WATCH_SPEC
from torpor.connectors.timers import TIMER_SPEC
from torpor.schemas.errors import DecodeError
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

    wait_until(published, timeout=60, message=f"the manifest; echo log:\n{deployment.log('echo')[-2000:]}")
    assert found["local"].specs == (canonical_spec(ECHO_SPEC),)
    assert found["local"].source == "connector:echo"
    echo.send_signal(signal.SIGTERM)
    assert echo.wait(timeout=60) == 0
