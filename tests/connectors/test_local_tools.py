"""The local-mode tools: each answers through its sink, later, with ids from the request."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

from torpor.connectors.approvals import DeployTool
from torpor.connectors.echo import EchoTool
from torpor.connectors.inprocess import InProcessConnector
from torpor.connectors.router import ToolRouter
from torpor.connectors.subscriptions import WatchTool
from torpor.connectors.timers import TimerConnector
from torpor.schemas.ids import derive_id
from torpor.schemas.records import (
    ApprovalRequest,
    Capability,
    Dispatch,
    Input,
    TextBlock,
    TimerFired,
    ToolEvent,
    ToolResult,
)

CAPABILITY = Capability("local", ("echo", "deploy"), (), None)


def dispatch(
    tool: str, arguments: object, kind: str = "invoke", request_id: str = "req-1", call_id: str = "call-1"
) -> Dispatch:
    return Dispatch(request_id, "t1", call_id, tool, json.dumps(arguments), CAPABILITY, 0, 1, None, kind)


def clock() -> int:
    return time.time_ns() // 1_000_000


# Generous: the tasks are in-process, but a loaded machine may not run them for seconds.
async def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    end = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


def run(test: Callable[[list[Input]], Awaitable[None]]) -> list[Input]:
    received: list[Input] = []
    asyncio.run(test(received))
    return received


def test_echo_answers_later_with_an_id_derived_from_the_request() -> None:
    async def go(out: list[Input]) -> None:
        echo = EchoTool(out.append, clock)
        echo.submit(dispatch("echo", {"text": "hi", "delay_s": 0.01}))
        assert out == [] and echo.busy == 1  # not inside the caller: later
        await until(lambda: len(out) == 1)
        await until(lambda: echo.busy == 0)  # the answer is produced before the task ends

    (answer,) = run(go)
    assert answer.message_id == derive_id("req-1", "result") and answer.source == "connector:echo"
    assert answer.body == ToolResult("call-1", "req-1", True, (TextBlock("echo: hi"),), False)


def test_a_cancelled_echo_never_answers_and_a_repeat_dispatch_is_ignored() -> None:
    async def go(out: list[Input]) -> None:
        echo = EchoTool(out.append, clock)
        echo.submit(dispatch("echo", {"text": "slow", "delay_s": 5}))
        echo.submit(dispatch("echo", {"text": "slow", "delay_s": 5}))
        assert echo.busy == 1
        echo.submit(dispatch("echo", {}, kind="cancel", request_id="cancel-1"))
        await asyncio.sleep(0.02)
        assert echo.busy == 0

    assert run(go) == []


def test_watch_sends_the_result_then_an_associative_and_a_threaded_event() -> None:
    async def go(out: list[Input]) -> None:
        watch = WatchTool(out.append, clock)
        watch.submit(dispatch("watch", {"topic": "alerts", "interval_s": 0.001}))
        await until(lambda: len(out) == 3)

    result, first, second = run(go)
    assert isinstance(result.body, ToolResult) and result.body.subscription
    assert isinstance(first.body, ToolEvent) and isinstance(second.body, ToolEvent)
    assert (first.body.sequence, first.body.associative, first.body.final) == (0, True, False)
    assert (second.body.sequence, second.body.associative, second.body.final) == (1, False, True)
    assert len({result.message_id, first.message_id, second.message_id}) == 3


def test_deploy_asks_for_approval_and_finishes_after_the_decision() -> None:
    async def go(out: list[Input]) -> None:
        deploy = DeployTool(out.append, clock)
        deploy.submit(dispatch("deploy", {"target": "web"}))
        assert len(out) == 1 and deploy.busy == 0  # waiting for a person is not busy
        request = out[0].body
        assert isinstance(request, ApprovalRequest) and request.choices == ("approve", "reject")
        decision = {"approval_id": request.approval_id, "choice": "approve", "decided_by": "user:ann"}
        deploy.submit(dispatch("deploy", decision, kind="approval_decision", request_id="req-2"))
        deploy.submit(dispatch("deploy", decision, kind="approval_decision", request_id="req-3"))  # late copy

    _, result = run(go)
    assert isinstance(result.body, ToolResult) and result.body.ok
    assert (result.body.request_id, result.body.content) == ("req-1", (TextBlock("deployed web"),))


def test_a_rejected_deploy_answers_with_an_error() -> None:
    async def go(out: list[Input]) -> None:
        deploy = DeployTool(out.append, clock)
        deploy.submit(dispatch("deploy", {"target": "db"}))
        decision = {"choice": "reject", "decided_by": "user:bob"}
        deploy.submit(dispatch("deploy", decision, kind="approval_decision", request_id="req-2"))

    _, result = run(go)
    assert isinstance(result.body, ToolResult) and not result.body.ok


def test_the_timer_fires_when_the_wall_clock_passes_the_due_time() -> None:
    async def go(out: list[Input]) -> None:
        timers = TimerConnector(out.append, clock)
        due = clock() + 50
        timers.submit(dispatch("timer", {"due_at": due, "tool": "sleep"}))
        await until(lambda: len(out) == 1)
        assert clock() >= due
        fired = out[0].body
        assert fired == TimerFired("call-1", "req-1", due) and out[0].source == "timer"

    run(go)


def test_a_cancelled_timer_does_not_fire() -> None:
    async def go(out: list[Input]) -> None:
        timers = TimerConnector(out.append, clock)
        timers.submit(dispatch("timer", {"due_at": clock() + 30, "tool": "sleep"}))
        timers.submit(dispatch("timer", {}, kind="close_thread", request_id="close-1"))
        await asyncio.sleep(0.06)

    assert run(go) == []


def test_the_router_routes_by_tool_and_answers_unknown_tools_with_an_error() -> None:
    async def go(out: list[Input]) -> None:
        tools: list[InProcessConnector] = [EchoTool(out.append, clock), TimerConnector(out.append, clock)]
        router = ToolRouter(tools, out.append)
        assert router.spec("echo").name == "echo"
        router.submit(dispatch("nope", {}))
        router.submit(dispatch("echo", {"text": "x", "delay_s": 0}, request_id="req-2"))
        await until(lambda: len(out) == 2)
        await router.close()

    unknown, echoed = run(go)
    assert isinstance(unknown.body, ToolResult) and not unknown.body.ok
    assert isinstance(echoed.body, ToolResult) and echoed.body.ok
