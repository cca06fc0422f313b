"""Every row of `TRANSITIONS`, exercised: each status meets one example of each body.

The scenario tests in `test_fold.py` check what each row does in detail; this module
checks that every (status, body) pair is handled with exactly one receipt and the
disposition its row promises, never an exception.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.processors.fold_scenarios import (
    World,
    call,
    completion,
    config,
    control,
    create,
    event,
    result,
    user,
)
from torpor.processors.fold.state import Status
from torpor.processors.fold.transitions import BODY_TYPES, TRANSITIONS
from torpor.schemas.records import (
    ApprovalDecision,
    ApprovalRequest,
    ChildReport,
    InputBody,
    ParentMessage,
    TimerFired,
)


def in_status(status: Status) -> tuple[World, str]:
    """A world whose thread (returned) is in `status`."""
    world = World()
    world.send("t", create(config()))
    if status is Status.AWAITING_MODEL:
        return world, "t"
    world.reply("t", "working", (call("c1", "fetch", {}),))
    if status is Status.AWAITING_TOOLS:
        return world, "t"
    world.send("t", result("c1", world.dispatch_for("t", "c1").request_id))
    world.reply("t", "spawning", (call("s1", "spawn_thread", {"instructions": "x"}),))
    world.reply("t", "done")
    if status is Status.IDLE:
        return world, "t"
    if status is Status.PARKED:
        world.send("t", control("park"))
        return world, "t"
    if status is Status.STOPPED:
        world.send("t", control("stop"))
        return world, "t"
    child = world.children("t")[0]
    world.reply(child, "bye", (call("k", "close_thread", {}),))
    return world, child


def example(kind: type[InputBody], world: World, thread: str) -> InputBody:
    state = world.state(thread)
    pending = state.pending_calls[0] if state.pending_calls else None
    call_id, request_id = (pending.call_id, pending.request_id) if pending else ("c1", "r1")
    link = state.config.parent
    makers: dict[type[InputBody], Callable[[], InputBody]] = {
        type(create()): lambda: create(),
        type(user("x")): lambda: user("hello"),
        type(completion("r")): lambda: completion(state.pending_request or "r-none", "hi"),
        type(result("c", "r")): lambda: result(call_id, request_id),
        type(event("c", "r", 1)): lambda: event("w9", "r9", 1),
        ChildReport: lambda: ChildReport(
            child_thread_id="nobody", spawn_call_id="s0", kind="report", text="x"
        ),
        ParentMessage: lambda: ParentMessage(
            parent_thread_id=link.parent_thread_id if link else "p",
            spawn_call_id=link.spawn_call_id if link else "s",
            text="hi",
        ),
        TimerFired: lambda: TimerFired(call_id=call_id, request_id=request_id, due_at=0),
        ApprovalRequest: lambda: ApprovalRequest("a1", call_id, request_id, "ok?", ("yes", "no"), None, None),
        ApprovalDecision: lambda: ApprovalDecision("a1", "yes", "user:bob"),
        type(control("park")): lambda: control("set_model", model="other"),
    }
    return makers[kind]()


ALLOWED = {
    Status.PARKED: {"parked", "applied", "rejected:unexpected_CreateThread_while_parked"},
    Status.STOPPED: {"stopped", "applied", "rejected:unexpected_CreateThread_while_stopped"},
    Status.CLOSED: {"stale", "rejected:thread_closed", "rejected:unexpected_CreateThread_while_closed"},
}


@pytest.mark.parametrize("status", list(Status), ids=lambda s: s.value)
@pytest.mark.parametrize("kind", BODY_TYPES, ids=lambda k: k.__name__)
def test_every_row_answers_with_one_receipt(status: Status, kind: type[InputBody]) -> None:
    world, thread = in_status(status)
    assert world.state(thread).status is status
    assert (status, kind) in TRANSITIONS
    before = len(world.receipts)
    receipt = world.deliver(world.envelope(thread, example(kind, world, thread)))
    assert len(world.receipts) == before + 1 and receipt.input_id == world.inputs[-1].message_id
    assert receipt.disposition.split(":")[0] in {
        "applied",
        "duplicate",
        "deferred",
        "stale",
        "rejected",
        "stopped",
        "parked",
    }
    if status in ALLOWED:
        assert receipt.disposition in ALLOWED[status], receipt.disposition
