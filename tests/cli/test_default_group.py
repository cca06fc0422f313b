"""Default consumer groups follow the topic prefix, so two deployments never share one."""

from __future__ import annotations

from torpor.cli.settings import default_group
from torpor.streams.config import Settings, TopicSettings


def test_the_default_prefix_keeps_the_historic_names_and_another_prefix_gets_its_own() -> None:
    assert default_group(Settings(), "processor") == "torpor-processor"
    assert default_group(Settings(), "connector-EchoTool") == "torpor-connector-EchoTool"
    staging = Settings(topics=TopicSettings(prefix="staging."))
    assert default_group(staging, "processor") == "staging.processor"
    assert default_group(staging, "processor") != default_group(Settings(), "processor")
