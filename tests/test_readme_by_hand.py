"""README's "Kafka mode, by hand", run as typed against a real broker (issue 19).

The commands are read from the README itself, so the test fails the day the README and
the code disagree. Lines run in order: `broker start|stop` and `export` stand for the
test's broker (TORPOR_BOOTSTRAP) and a topic prefix of its own; commands that keep
running (the processor, connectors, `tail`) start in the background; the others must
exit 0. Like a person would, the test waits for the agent's answer on `tail` before it
sends the next turn, and skips the line whose APPROVAL_ID is a placeholder.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Final

import pytest

from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

REPO: Final = Path(__file__).resolve().parent.parent
TORPOR: Final = str(Path(sys.executable).with_name("torpor"))
BACKGROUND: Final = (("processor",), ("connector", "run-echo"), ("connector", "run-timers"), ("tail",))


def readme_commands() -> list[list[str]]:
    """The torpor commands of README's by-hand block, in order, as argv lists."""
    text = (REPO / "README.md").read_text()
    block = text.split("Kafka mode, by hand:\n\n", 1)[1].split("\n\n", 1)[0]
    found: list[list[str]] = []
    for line in block.splitlines():
        argv = shlex.split(line, comments=True)
        if argv and argv[0] == ".venv/bin/torpor":
            found.append(argv[1:])
    return found


def test_the_readme_block_is_what_this_test_expects() -> None:
    commands = readme_commands()
    assert commands[0] == ["broker", "start"] and commands[-1] == ["broker", "stop"]
    assert ["topics", "create"] in commands
    assert any(c[:1] == ["processor"] for c in commands) and any(c[:1] == ["send"] for c in commands)


def test_the_by_hand_flow_works_as_typed(kafka_bootstrap: str, tmp_path: Path) -> None:
    # Relative paths in the README are the repository's: the same files, in a scratch copy.
    shutil.copytree(REPO / "torpor" / "scenarios", tmp_path / "torpor" / "scenarios")
    env = {**os.environ, "TORPOR_BOOTSTRAP": kafka_bootstrap,
           "TORPOR_TOPIC_PREFIX": f"hand.{uuid.uuid4().hex[:8]}."}
    running: list[tuple[subprocess.Popen[bytes], Path]] = []

    def log_of(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text(errors="replace")

    def logs() -> str:
        return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-2000:]}" for _, p in running)

    try:
        for argv in readme_commands():
            if argv[0] == "broker" or "APPROVAL_ID" in argv:
                continue
            if tuple(argv[:2]) in BACKGROUND or tuple(argv[:1]) in BACKGROUND:
                name = "-".join(argv[:2])
                path = tmp_path / f"{name}.log"
                with path.open("wb") as out:
                    running.append((subprocess.Popen([TORPOR, *argv], cwd=tmp_path, env=env, stdout=out,
                                                     stderr=subprocess.STDOUT), path))
                if argv[0] == "tail":  # a person reads the answer before typing the next turn
                    wait_until(lambda: "The echo said ping." in log_of("tail-agent-1"), timeout=180,
                               message=f"the first answer on tail\n{logs()}")
                continue
            done = subprocess.run([TORPOR, *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=240, check=False)
            assert done.returncode == 0, (argv, done.stdout, done.stderr[-3000:], logs())
            if "--wait" in argv:
                assert " applied" in done.stdout, done.stdout
        wait_until(lambda: "The echo said again." in log_of("tail-agent-1"), timeout=180,
                   message=f"the second answer on tail\n{logs()}")
        assert "model_set" in log_of("tail-agent-1") or "set_model" in log_of("tail-agent-1"), logs()
    finally:
        for process, _ in running:
            process.terminate()
        for process, _ in running:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
