"""`torpor processor` says at start when a provider key will leave for another host."""

from __future__ import annotations

import pytest

from torpor.cli.processor_run import OPENAI_HOST, _warn_if_a_key_leaves
from torpor.processors.models.providers.settings import EndpointSettings
from torpor.streams.config import Secret


@pytest.mark.parametrize(("base_url", "key", "warned"), [
    ("http://127.0.0.1:8000/v1", "sk-secret", True),
    ("https://api.openai.com.evil.example/v1", "sk-secret", True),
    ("https://api.openai.com/v1", "sk-secret", False),
    (None, "sk-secret", False),
    ("http://127.0.0.1:8000/v1", None, False),
])
def test_a_key_sent_to_another_host_is_announced(
        base_url: str | None, key: str | None, warned: bool, capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = EndpointSettings(base_url=base_url, api_key=Secret(key) if key else None)
    _warn_if_a_key_leaves("--openai-base-url", endpoint, "OPENAI_API_KEY", OPENAI_HOST)
    err = capsys.readouterr().err
    assert ("warning: the key in $OPENAI_API_KEY will be sent to" in err) is warned
    assert "sk-secret" not in err
