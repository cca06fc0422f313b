"""`run_command`: streamed output as associative events, the exit code last, cancel kills the group."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.processors.test_processor import Deployment, deployment
from tests.waiting import wait_until
from torpor.connectors.journal import EffectJournal
from torpor.connectors.runtime import ConnectorRuntime
from torpor.connectors.subprocess_tool import SubprocessTool
from torpor.schemas.codec import encode_value
from torpor.schemas.ids import derive_id
from torpor.schemas.records import Capability, Dispatch, Input, TextBlock, ToolEvent, ToolResult
from torpor.streams.config import KafkaSettings, Settings, TopicSettings

__all__ = ["deployment"]  # the fixture, shared with test_processor

ALLOWED = Capability("local", ("run_command",), (), None)


def dispatch(arguments: object, kind: str = "invoke", request_id: str = "req-1",
             capability: Capability = ALLOWED) -> Dispatch:
    return Dispatch(request_id, "t1", "call-1", "run_command", json.dumps(arguments), capability, 0, 1, None,
                    kind)


def clock() -> int:
    return time.time_ns() // 1_000_000


# Generous: a command is a process, and a loaded machine may not schedule it for seconds.
async def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    end = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


def run(test: Callable[[SubprocessTool, list[Input]], Awaitable[None]]) -> list[Input]:
    received: list[Input] = []

    async def go() -> None:
        tool = SubprocessTool(received.append, clock)
        try:
            await test(tool, received)
        finally:
            await tool.close()

    asyncio.run(go())
    return received


def texts(inputs: list[Input]) -> str:
    return "\n".join(block.text for i in inputs if isinstance(i.body, ToolEvent)
                     for block in i.body.content if isinstance(block, TextBlock))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        # A killed child not yet reaped by its (dead) parent is a zombie: gone for our purpose.
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):  # reaped, perhaps between the two looks
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_output_streams_while_running_then_the_final_event_has_the_exit_code(tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    async def go(tool: SubprocessTool, out: list[Input]) -> None:
        # The command goes on only once the test opens the gate (not after a sleep a loaded
        # machine could outlast before "one" is seen).
        command = f"echo one; echo two >&2; while [ ! -e {gate} ]; do sleep 0.01; done; echo three; exit 3"
        tool.submit(dispatch({"command": command}))
        # "one" is out before the command ends: streamed, not collected at the end.
        await until(lambda: "one" in texts(out))
        assert tool.busy == 1 and "three" not in texts(out)
        gate.touch()
        await until(lambda: tool.busy == 0)

    out = run(go)
    result, *events = out
    assert result.message_id == derive_id("req-1", "result")
    assert isinstance(result.body, ToolResult) and result.body.ok and result.body.subscription
    bodies = [e.body for e in events]
    assert all(isinstance(b, ToolEvent) and b.associative for b in bodies)
    assert [b.sequence for b in bodies if isinstance(b, ToolEvent)] == list(range(len(bodies)))
    assert [b.final for b in bodies if isinstance(b, ToolEvent)] == [False] * (len(bodies) - 1) + [True]
    assert [e.message_id for e in events] == [derive_id("req-1", "event", str(n)) for n in range(len(events))]
    output = texts(out)
    assert "[stdout] one" in output and "[stderr] two" in output and "[stdout] three" in output
    assert output.endswith("exit code 3")


def test_an_argv_list_runs_without_a_shell() -> None:
    async def go(tool: SubprocessTool, out: list[Input]) -> None:
        tool.submit(dispatch({"command": ["echo", "$HOME; not a shell"]}))
        await until(lambda: tool.busy == 0)

    assert "[stdout] $HOME; not a shell" in texts(run(go))


def test_cancel_kills_the_process_group_including_a_child_of_the_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    # The shell starts a background sleep (a grandchild of the tool) and records its pid.
    # It outlives the wait below: gone within it means killed.
    command = f"sleep 600 & echo $! > {pidfile}; echo started; wait"

    async def go(tool: SubprocessTool, out: list[Input]) -> None:
        tool.submit(dispatch({"command": command}))
        await until(lambda: pidfile.exists() and pidfile.read_text().endswith("\n"))
        grandchild = int(pidfile.read_text())
        assert alive(grandchild)
        tool.submit(dispatch({}, kind="cancel", request_id="cancel-1"))
        await until(lambda: not alive(grandchild), timeout_s=120)
        assert tool.busy == 0

    out = run(go)
    assert not any(isinstance(i.body, ToolEvent) and i.body.final for i in out)  # no answer after a cancel


def test_a_timeout_kills_the_group_and_says_so() -> None:
    async def go(tool: SubprocessTool, out: list[Input]) -> None:
        tool.submit(dispatch({"command": "sleep 30 & sleep 30", "timeout_s": 0.2}))
        await until(lambda: tool.busy == 0)

    output = texts(run(go))
    assert "timed out after 0.2 s" in output


def test_a_grandchild_holding_the_pipes_does_not_hang_the_call() -> None:
    async def go(tool: SubprocessTool, out: list[Input]) -> None:
        # The grandchild outlives the wait: a call that waited for the pipes would not end within it.
        tool.submit(dispatch({"command": "sleep 600 & echo done"}))
        await until(lambda: tool.busy == 0, timeout_s=120)

    assert texts(run(go)).endswith("exit code 0")


def test_a_command_that_cannot_start_and_bad_arguments_are_error_results(tmp_path: Path) -> None:
    async def go(tool: SubprocessTool, out: list[Input]) -> None:
        tool.submit(dispatch({"command": ["/no/such/binary"]}))
        tool.submit(dispatch({"command": 7}, request_id="req-2"))
        tool.submit(dispatch({"command": "true", "cwd": str(tmp_path / "missing")}, request_id="req-3"))
        await until(lambda: len(out) == 3)

    results = [i.body for i in run(go)]
    assert all(isinstance(r, ToolResult) and not r.ok and not r.subscription for r in results)
    assert any("/no/such/binary" in r.content[0].text for r in results  # type: ignore[union-attr]
               if isinstance(r, ToolResult))


def test_a_dispatch_outside_the_capability_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    async def go(tool: SubprocessTool, out: list[Input]) -> None:
        refused = Capability("local", ("echo",), (), None)
        tool.submit(dispatch({"command": f"touch {marker}"}, capability=refused))
        expired = Capability("local", ("run_command",), (), 1)
        tool.submit(dispatch({"command": f"touch {marker}"}, request_id="req-2", capability=expired))
        await until(lambda: len(out) == 2)
        assert tool.busy == 0  # nothing started (a sleep here would only guess how long a start takes)

    first, second = (i.body for i in run(go))
    assert isinstance(first, ToolResult) and not first.ok and "outside the capability" in str(first.content)
    assert isinstance(second, ToolResult) and not second.ok and "expired" in str(second.content)
    assert not marker.exists()


def test_output_beyond_the_limit_is_dropped_and_counted() -> None:
    async def go(tool: SubprocessTool, out: list[Input]) -> None:
        tool.submit(dispatch({"command": "head -c 400000 /dev/zero | tr '\\0' 'x' | fold -w 1000"}))
        await until(lambda: tool.busy == 0)

    out = run(go)
    assert "bytes of output dropped beyond 262144" in texts(out)
    assert sum(len(t) for t in texts(out).splitlines()) < 300_000


@pytest.mark.kafka
def test_served_by_the_connector_runtime_the_output_and_exit_code_reach_the_inputs_topic(
    deployment: Deployment, tmp_path: Path
) -> None:
    """The factory contract of `torpor connector run MODULE:NAME`, against the real broker."""
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=deployment.bootstrap),
                        topics=TopicSettings(prefix=deployment.prefix))
    producer = Producer({"bootstrap.servers": deployment.bootstrap})
    invoke = dispatch({"command": "echo over-kafka; exit 2"}, request_id="rq-kafka")
    producer.produce(deployment.topic("outbox"), key=invoke.thread_id.encode(), value=encode_value(invoke))
    assert producer.flush(30) == 0

    def answered() -> bool:
        return any(isinstance(i.body, ToolEvent) and i.body.final for i in deployment.inputs())

    async def go() -> None:
        runtime = ConnectorRuntime(settings, SubprocessTool, group=f"g-{deployment.prefix}",
                                   journal=EffectJournal(tmp_path / "journal"))
        done = asyncio.Event()

        async def watch() -> None:
            await asyncio.to_thread(wait_until, answered, timeout=60, message="the command's final event")
            done.set()

        watcher = asyncio.create_task(watch())
        await runtime.run(done.is_set)
        await watcher

    asyncio.run(go())
    inputs = [i for i in deployment.inputs() if i.thread_id == "t1"]
    assert isinstance(inputs[0].body, ToolResult) and inputs[0].body.subscription
    assert inputs[0].message_id == derive_id("rq-kafka", "result")
    assert "[stdout] over-kafka" in texts(inputs) and texts(inputs).endswith("exit code 2")


def test_after_a_restart_an_unfinished_command_is_not_run_again(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    out: list[Input] = []
    tool = SubprocessTool(out.append, clock)
    assert tool.reconcile(dispatch({"command": f"touch {marker}"}))
    result, event = (i.body for i in out)
    assert isinstance(result, ToolResult) and not result.ok and "not run again" in str(result.content)
    assert result.request_id == "req-1" and out[0].message_id == derive_id("req-1", "result")
    assert isinstance(event, ToolEvent) and event.final and event.sequence > 10**9  # ends a subscription
    assert not marker.exists() and tool.busy == 0
