"""`--log-format json`: every line a processor writes to stderr is one JSON object.

A real processor (`TORPOR_LOG_FORMAT=json`, debug level, /metrics on) folds a
conversation and a poison record against a real broker until idle; every line of its
output parses as an object with time, level, logger and message, and the lines logged
per record carry the record's thread, partition and offset, the model stage's its request.
`torpor ui` in the same format hands uvicorn's lines (startup, access log) to the JSON handler.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
import uuid
from pathlib import Path
from typing import Final

import pytest

from tests.processors.test_processor import REPO, TORPOR, Deployment, _conversation, deployment
from tests.waiting import wait_until

pytestmark = pytest.mark.kafka
__all__ = ["deployment"]

REQUIRED: Final = {"time", "level", "logger", "message"}


def test_a_processor_with_json_logs_writes_only_json_lines_with_the_record_fields(
        deployment: Deployment) -> None:
    thread = f"json-{uuid.uuid4().hex[:8]}"
    deployment.send(*_conversation(thread, "hello"))
    deployment.send_raw(thread.encode(), b"not an input at all")
    env = {**deployment.env, "TORPOR_LOG_FORMAT": "json"}
    args = deployment.processor_args("p0", "--until-idle", "--log-level", "debug", "--metrics-port", "0")
    result = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines
    parsed = []
    for line in lines:
        found = json.loads(line)  # raises on any line that is not JSON
        assert isinstance(found, dict) and found.keys() >= REQUIRED, line
        parsed.append(found)
    messages = [p["message"] for p in parsed]
    assert any(m.startswith("metrics on http://") for m in messages), messages
    assert any(m.startswith("processor p0 stopped") for m in messages), messages
    poison = [p for p in parsed if "input parked" in p["message"]]
    assert poison and all({"partition", "offset"} <= p.keys() for p in poison), poison
    folded = [p for p in parsed if p["message"] == "folded" and p.get("thread_id") == thread]
    assert len(folded) >= 3, parsed  # create, hello and the completion
    assert all(isinstance(p["partition"], int) and isinstance(p["offset"], int) for p in folded)
    published = [p for p in parsed if p["message"] == "completion published" and p.get("thread_id") == thread]
    assert published and all(p.get("request_id") for p in published), published


def test_the_ui_with_json_logs_writes_uvicorns_lines_as_json_too(kafka_bootstrap: str,
                                                                 tmp_path: Path) -> None:
    env = {**os.environ, "TORPOR_BOOTSTRAP": kafka_bootstrap, "TORPOR_LOG_FORMAT": "json",
           "TORPOR_TOPIC_PREFIX": f"test.jsonui.{uuid.uuid4().hex[:8]}."}  # no topics: the feed says so
    err = tmp_path / "ui.err"
    with open(err, "wb") as stderr:
        process = subprocess.Popen([TORPOR, "ui", "--port", "0"], cwd=REPO, env=env,
                                   stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip().removeprefix("torpor ui: ")
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
        wait_until(lambda: "GET / HTTP" in err.read_text(), timeout=60, message="the access log line")
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C: a clean stop
        assert process.wait(timeout=60) == 0
    lines = [json.loads(line) for line in err.read_text().splitlines()]
    assert all(isinstance(line, dict) and line.keys() >= REQUIRED for line in lines), lines
    assert any(line["logger"] == "uvicorn.access" for line in lines), lines
