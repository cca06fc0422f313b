"""`torpor processor --script FILE`: a file of `[[model]]` rules is a script, nothing more needed.

Issue 21: a rules-only file was refused with "[thread]: expected a table, got NoneType"
(the processor read it as a whole `torpor local run` scenario). The loader takes the rules
alone, accepts a scenario file as before, and says exactly what is wrong otherwise, before
the processor touches Kafka.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from torpor.cli import main
from torpor.cli.scenario import ScenarioError, load, load_rules

NOWHERE = "127.0.0.1:9"  # nothing listens: a command that got as far as Kafka would fail there

RULES_ONLY = """\
[[model]]
last_contains = "please ping"
turns = [{ text = "Pinging.", calls = [{ name = "echo", arguments = { text = "ping" } }] }]

[[model]]
turns = [{ text = "Done." }]
"""


def _file(tmp_path: Path, text: str, name: str = "script.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_file_of_model_rules_alone_is_a_script(tmp_path: Path) -> None:
    rules = load_rules(_file(tmp_path, RULES_ONLY))
    assert [r.last_contains for r in rules] == ["please ping", None]
    assert rules[0].turns[0].tool_calls[0].name == "echo"


def test_a_whole_scenario_is_a_script_too_its_thread_and_steps_unused(tmp_path: Path) -> None:
    scenario = '[thread]\nid = "agent"\n\n' + RULES_ONLY + '\n[[steps]]\nsay = "hello"\n'
    path = _file(tmp_path, scenario)
    assert load_rules(path) == load(path).rules


def test_a_json_script_of_rules_alone_is_a_script(tmp_path: Path) -> None:
    path = _file(tmp_path, '{"model": [{"turns": [{"text": "Hi."}]}]}', "script.json")
    assert load_rules(path)[0].turns[0].chunks == ("Hi.",)


@pytest.mark.parametrize(("text", "says"), [
    ("", "no [[model]] rule"),
    ('[thread]\nid = "agent"\n', "no [[model]] rule"),
    ('[[models]]\nturns = [{ text = "x" }]\n', "unknown top-level models"),
    ("[[model]]\nturns = 3\n", "[[model]] #1: expected a list"),
    ("[[model", "cannot read scenario"),
])
def test_a_bad_script_says_what_it_needs(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(says)):
        load_rules(_file(tmp_path, text))


def test_a_local_scenario_without_a_thread_says_it_needs_one(tmp_path: Path) -> None:
    needs = r"needs a \[thread\] table with an `id`.*torpor processor --script"
    with pytest.raises(ScenarioError, match=needs):
        load(_file(tmp_path, RULES_ONLY))


def test_the_processor_refuses_a_bad_script_before_touching_kafka(tmp_path: Path) -> None:
    path = _file(tmp_path, '[[models]]\nturns = [{ text = "x" }]\n')
    result = CliRunner().invoke(main, ["processor", "--instance", "p0", "--script", str(path),
                                       "--store-dir", str(tmp_path / "stores"), "--bootstrap", NOWHERE])
    assert result.exit_code == 1, result.output
    assert "unknown top-level models" in result.output


def test_the_processor_help_says_rules_alone_are_enough() -> None:
    result = CliRunner().invoke(main, ["processor", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())  # as wrapped for any terminal width
    assert "file of [[model]] rules" in text and "nothing else is needed" in text
