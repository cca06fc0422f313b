"""The approval relay: a decision reaches the waiting tool exactly once, also across a restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from torpor.connectors.approvals import ApprovalRelay, DeployTool
from torpor.schemas.ids import derive_id
from torpor.schemas.records import ApprovalRequest, Capability, Dispatch, Input, TextBlock, ToolResult

ALLOWED = Capability("local", ("deploy",), (), None)


def dispatch(arguments: object, kind: str = "invoke", request_id: str = "req-1", call_id: str = "call-1",
             capability: Capability = ALLOWED) -> Dispatch:
    return Dispatch(request_id, "t1", call_id, "deploy", json.dumps(arguments), capability, 0, 1, None, kind)


def decision(choice: str = "approve", who: str = "user:ann", request_id: str = "dec-1",
             call_id: str = "call-1", capability: Capability = ALLOWED) -> Dispatch:
    arguments = {"approval_id": f"approval-{call_id}", "choice": choice, "decided_by": who}
    return dispatch(arguments, "approval_decision", request_id, call_id, capability)


class Clock:
    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def results(out: list[Input]) -> list[ToolResult]:
    return [i.body for i in out if isinstance(i.body, ToolResult)]


def in_loop(test: Callable[[], None]) -> None:
    """The relay answers inside `submit`; a loop is running in production, so it runs in one here."""

    async def go() -> None:
        test()

    asyncio.run(go())


def test_a_decision_acts_exactly_once_however_often_it_arrives() -> None:
    out: list[Input] = []

    def script() -> None:
        tool = DeployTool(out.append, Clock())
        tool.submit(dispatch({"target": "web"}))
        assert tool.waiting == 1 and tool.busy == 0
        tool.submit(decision())
        tool.submit(decision())  # the same dispatch redelivered
        tool.submit(decision("reject", "user:bob", request_id="dec-2"))  # a second decision
        assert tool.waiting == 0

    in_loop(script)
    request, result = out
    assert isinstance(request.body, ApprovalRequest) and request.body.prompt == "Deploy web?"
    assert request.message_id == derive_id("req-1", "approval")
    assert result.message_id == derive_id("req-1", "result")
    assert result.body == ToolResult("call-1", "req-1", True, (TextBlock("deployed web"),), False)


def test_after_a_restart_the_resubmitted_invoke_waits_again_and_the_decision_finds_it() -> None:
    before: list[Input] = []
    after: list[Input] = []

    def script() -> None:
        DeployTool(before.append, Clock()).submit(dispatch({"target": "db"}))
        restarted = DeployTool(after.append, Clock())
        restarted.submit(decision(request_id="early"))  # not waiting yet: ignored, not acted on
        assert results(after) == []
        restarted.submit(dispatch({"target": "db"}))  # the runtime resubmits the unfinished invoke
        restarted.submit(decision())

    in_loop(script)
    # The re-sent request is the same message: the fold absorbs it as a duplicate.
    assert after[0].message_id == before[0].message_id and after[0].body == before[0].body
    (result,) = results(after)
    assert result.ok and result.content == (TextBlock("deployed db"),)


def test_a_cancelled_call_ignores_a_later_decision() -> None:
    out: list[Input] = []

    def script() -> None:
        tool = DeployTool(out.append, Clock())
        tool.submit(dispatch({"target": "web"}))
        tool.submit(dispatch({}, kind="cancel", request_id="cancel-1"))
        tool.submit(decision())

    in_loop(script)
    assert results(out) == []


def test_outside_the_capability_no_person_is_asked_and_expiry_refuses_the_action() -> None:
    out: list[Input] = []
    clock = Clock(1_000)

    def script() -> None:
        tool = DeployTool(out.append, clock)
        tool.submit(dispatch({"target": "web"}, capability=Capability("local", ("echo",), (), None)))
        expiring = Capability("local", ("deploy",), (), 2_000)
        tool.submit(dispatch({"target": "db"}, request_id="req-2", call_id="call-2", capability=expiring))
        clock.now = 2_500  # the person decides after the capability expired
        tool.submit(decision(request_id="dec-2", call_id="call-2", capability=expiring))

    in_loop(script)
    assert [type(i.body).__name__ for i in out] == ["ToolResult", "ApprovalRequest", "ToolResult"]
    first, second = results(out)
    assert not first.ok and "outside the capability" in str(first.content)
    assert not second.ok and second.request_id == "req-2" and "expired" in str(second.content)


def test_bad_arguments_and_an_unreadable_decision_are_error_results() -> None:
    out: list[Input] = []

    def script() -> None:
        tool = DeployTool(out.append, Clock())
        tool.submit(dispatch({"no_target": 1}))
        tool.submit(dispatch({"target": "web"}, request_id="req-2", call_id="call-2"))
        tool.submit(dispatch({"nothing": True}, "approval_decision", "dec-2", "call-2"))

    in_loop(script)
    first, second = results(out)
    assert not first.ok and "bad arguments" in str(first.content)
    assert not second.ok and "unreadable decision" in str(second.content)


def test_a_relay_can_ask_with_its_own_choices_and_a_deadline() -> None:
    class Spend(ApprovalRelay):
        name = "spend"
        choices = ("yes", "no", "ask_finance")
        approval_ttl_ms = 60_000

    out: list[Input] = []

    def script() -> None:
        tool = Spend(out.append, Clock())
        tool.submit(dispatch({"amount": 5}))
        tool.submit(decision("ask_finance", "user:cfo"))

    in_loop(script)
    request, result = out
    assert isinstance(request.body, ApprovalRequest)
    assert request.body.choices == ("yes", "no", "ask_finance") and request.body.expires_at == 1 + 60_000
    assert isinstance(result.body, ToolResult) and not result.body.ok
    assert "ask_finance by user:cfo" in str(result.body.content)
