"""The CLI refuses what the processor would refuse, before producing anything."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from torpor.cli import main

NOWHERE = "127.0.0.1:9"  # nothing listens: a command that got as far as producing would fail there


@pytest.mark.parametrize("args", [
    ["send", "", "hi"],
    ["send", "t\n12:00:00 forged", "hi"],
    ["send", "x" * 257, "hi"],
    ["send", "ok", "hi", "--message-id", "has space"],
    ["control", "", "stop"],
    ["control", "t\x1b[2J", "stop"],
    ["approve", "a1", "yes", "--thread", ""],
])
def test_an_id_the_processor_would_refuse_is_refused_before_producing(args: list[str]) -> None:
    result = CliRunner().invoke(main, [*args, "--bootstrap", NOWHERE])
    assert result.exit_code == 2, result.output
    assert "is not an id the processor accepts" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_signing_key_id_without_its_key_is_a_usage_error() -> None:
    args = ["send", "t1", "hi", "--signing-key-id", "gw-1", "--bootstrap", NOWHERE]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "give both --signing-key-id and --signing-key" in result.output
