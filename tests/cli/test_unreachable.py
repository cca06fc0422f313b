"""With no broker at the bootstrap address, each command ends with one clear line, not a
traceback (issue 19): what failed and what to check, exit code 1."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

TORPOR: Final = str(Path(sys.executable).with_name("torpor"))


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.parametrize("command", [
    ["send", "t1", "hello"],
    ["control", "t1", "stop"],
    ["approve", "a1", "approve", "--thread", "t1"],
    ["tail", "t1"],
])
def test_a_command_with_no_broker_to_reach_prints_one_line_and_exits_1(command: list[str]) -> None:
    done = subprocess.run([TORPOR, *command, "--bootstrap", f"127.0.0.1:{_closed_port()}"],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert ours == [ours[0]] and "cannot reach the Kafka broker" in ours[0], done.stderr[-2000:]
    assert "--bootstrap" in ours[0]
    assert "%3|" not in done.stderr, done.stderr[-2000:]  # librdkafka's log goes through Python logging
