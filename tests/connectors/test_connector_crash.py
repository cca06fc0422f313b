"""Connector crashes against a real broker: the effect journal and reconcile, durable timers.

A processor (scripted model) and a connector run as processes. The effect tool appends
its request id to a file; its connector is killed (SIGKILL, `TORPOR_CONNECTOR_FAULT=
after_effect`) after the effect and before the result is produced. After a restart the
tool's `reconcile` finds the effect, the effect is not performed again, and the thread
gets exactly one applied result. The timer connector is killed with three timers
pending; after a restart (once their due times have passed) each fires exactly once.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Final

import pytest

from tests.connectors.effect_tool import EFFECT_SPEC, effects
from tests.processors.test_processor import REPO, TORPOR, Deployment, deployment
from tests.waiting import wait_until
from torpor.schemas.records import (
    Budgets,
    Capability,
    CreateThread,
    Input,
    InputBody,
    TextBlock,
    ThreadConfig,
    TimerFired,
    ToolResult,
    UserMessage,
)

pytestmark = pytest.mark.kafka

__all__ = ["deployment"]  # the fixture, shared with test_processor

NAP_SECONDS: Final = 20
"""Long enough that no nap is due before all three are journaled and the connector is
killed, even on a loaded machine (at 3 s, the first thread's nap could fire while the
third was still being folded, and the test would see a timer fired before the kill)."""
SCRIPT: Final = f"""\
[thread]
id = "unused"

[[model]]
last_contains = "done"
turns = [{{ text = "The effect is done." }}]

[[model]]
last_contains = "please act"
turns = [{{ text = "Acting.", calls = [{{ name = "effect", arguments = {{}} }}] }}]

[[model]]
last_contains = "Slept for"
turns = [{{ text = "Rested." }}]

[[model]]
last_contains = "please nap"
turns = [{{ text = "Napping.", calls = [{{ name = "sleep", arguments = {{ seconds = {NAP_SECONDS} }} }}] }}]
"""


def _config() -> ThreadConfig:
    return ThreadConfig(
        model="scripted", system_prompt="You are a test agent.", tools=(EFFECT_SPEC,),
        capability=Capability(tenant="test", tools=("effect",), scopes=(), expires_at=None),
        budgets=Budgets(max_turns=None, max_children=None, max_tool_retries=2, max_invalid_calls=3),
        parent=None, context_window=200_000, compaction_threshold=0.8, allow_implicit_create=False,
    )


def _input(thread_id: str, label: str, body: InputBody) -> Input:
    return Input(message_id=f"{thread_id}-{label}", thread_id=thread_id, created_at=int(time.time() * 1000),
                 source="user:test", expires_at=None, key_id=None, signature=None, body=body)


def _start(deployment: Deployment, thread_id: str, text: str) -> None:
    deployment.send(_input(thread_id, "create", CreateThread(_config(), (), ())),
                    _input(thread_id, "text", UserMessage((TextBlock(text),))))


def _processor(deployment: Deployment) -> list[str]:
    script = deployment.root / "crash-script.toml"
    script.write_text(SCRIPT)
    return [TORPOR, "processor", "--instance", "p0", "--app", f"app-{deployment.prefix}",
            "--store-dir", str(deployment.root / "stores"), "--script", str(script)]


def _connector(deployment: Deployment, *command: str) -> list[str]:
    return [TORPOR, "connector", *command, "--group", f"conn-{deployment.prefix}",
            "--journal-dir", str(deployment.root / "journal")]


def test_a_connector_killed_between_effect_and_result_does_not_repeat_the_effect(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the effect tool lives in tests/
    monkeypatch.setenv("TORPOR_TEST_EFFECT_FILE", str(tmp_path / "effects.txt"))
    thread_id = f"effect-{uuid.uuid4().hex[:8]}"
    _start(deployment, thread_id, "please act")
    processor = deployment.start(_processor(deployment), "processor")
    target = ["run", "tests.connectors.effect_tool:EffectTool"]
    monkeypatch.setenv("TORPOR_CONNECTOR_FAULT", "after_effect")
    crashing = deployment.start(_connector(deployment, *target), "connector-0")
    wait_until(lambda: crashing.poll() is not None, timeout=120,
               message=lambda: f"the fault's kill; connector log:\n{deployment.log('connector-0')[-3000:]}")
    assert crashing.returncode == -signal.SIGKILL, deployment.log("connector-0")[-3000:]
    (dispatch,) = [d for d in deployment.dispatches() if d.thread_id == thread_id]
    assert effects() == [dispatch.request_id]  # the effect happened; its result was never produced
    assert not [i for i in deployment.inputs() if isinstance(i.body, ToolResult)]

    monkeypatch.delenv("TORPOR_CONNECTOR_FAULT")
    connector = deployment.start(_connector(deployment, *target), "connector-1")
    wait_until(lambda: "The effect is done." in deployment.answers(thread_id), timeout=120,
               message=lambda: f"the final answer; connector log:\n{deployment.log('connector-1')[-3000:]}")
    assert effects() == [dispatch.request_id]  # reconciled, not performed again
    assert "1 effects reconciled" in deployment.log("connector-1")
    results = [i for i in deployment.inputs() if isinstance(i.body, ToolResult)]
    assert {i.message_id for i in results} == {results[0].message_id}
    body = results[0].body
    assert isinstance(body, ToolResult) and body.content == (TextBlock("done (reconciled)"),)
    applied = [r for r in deployment.receipts() if r.input_id == results[0].message_id]
    assert [r.disposition for r in applied][:1] == ["applied"]
    assert all(r.disposition == "duplicate" for r in applied[1:])
    assert deployment.answers(thread_id) == ["Acting.", "The effect is done."]
    for process in (processor, connector):
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


def test_timers_pending_when_the_connector_dies_fire_once_after_a_restart(deployment: Deployment) -> None:
    threads = [f"nap-{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]
    for thread_id in threads:
        _start(deployment, thread_id, "please nap")
    processor = deployment.start(_processor(deployment), "processor")
    timers = deployment.start(_connector(deployment, "run-timers"), "timers-0")
    wait_until(lambda: deployment.log("timers-0").count("dispatch invoke timer journaled") == 3, timeout=120,
               message=lambda: f"three journaled timers; timers log:\n{deployment.log('timers-0')[-3000:]}")
    timers.send_signal(signal.SIGKILL)
    timers.wait(timeout=30)
    due = [json.loads(d.arguments)["due_at"] for d in deployment.dispatches() if d.tool == "timer"]
    assert len(due) == 3
    assert not [i for i in deployment.inputs() if isinstance(i.body, TimerFired)]
    # Down past every due time: on restart they are overdue and fire at once.
    wait_until(lambda: time.time() * 1000 > max(due), timeout=NAP_SECONDS + 30, message="the due times")
    restarted = deployment.start(_connector(deployment, "run-timers"), "timers-1")
    wait_until(lambda: all(deployment.answers(t) == ["Napping.", "Rested."] for t in threads), timeout=120,
               message=lambda: f"every nap's end; timers log:\n{deployment.log('timers-1')[-3000:]}")
    fired = [i for i in deployment.inputs() if isinstance(i.body, TimerFired)]
    assert Counter(i.thread_id for i in {i.message_id: i for i in fired}.values()) == Counter(threads)
    for record in fired:
        assert isinstance(record.body, TimerFired) and record.created_at >= record.body.due_at
    applied = Counter(r.input_id for r in deployment.receipts() if r.disposition == "applied")
    assert all(applied[i.message_id] == 1 for i in fired)
    assert "3 re-run" in deployment.log("timers-1")
    for process in (processor, restarted):
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
