"""`capability.check`: a connector refuses a dispatch outside the thread's capability."""

from __future__ import annotations

import json

from torpor.connectors.capability import check
from torpor.schemas.records import Capability, Dispatch


def dispatch(capability: Capability, tool: str = "run_command") -> Dispatch:
    return Dispatch("req-1", "t1", "call-1", tool, json.dumps({}), capability, 0, 1, None, "invoke")


def test_a_tool_inside_an_unexpired_capability_may_act() -> None:
    assert check(dispatch(Capability("acme", ("run_command",), ("exec",), 1_000)), 999, ("exec",)) is None
    assert check(dispatch(Capability("acme", ("run_command",), (), None)), 10**15) is None


def test_a_tool_outside_the_capability_is_refused_naming_tool_and_tenant() -> None:
    reason = check(dispatch(Capability("acme", ("echo",), (), None)), 0)
    assert reason is not None and "run_command" in reason and "acme" in reason and "outside" in reason


def test_an_expired_capability_is_refused_at_its_expiry_not_before() -> None:
    capability = Capability("acme", ("run_command",), (), 1_000)
    assert check(dispatch(capability), 999) is None
    reason = check(dispatch(capability), 1_000)
    assert reason is not None and "expired" in reason


def test_a_missing_scope_is_refused_naming_the_scope() -> None:
    reason = check(dispatch(Capability("acme", ("run_command",), ("read",), None)), 0, ("exec", "read"))
    assert reason is not None and "exec" in reason and "read" not in reason.split("scope(s)")[1].split(",")[0]


def test_a_dispatch_without_a_tenant_is_refused() -> None:
    reason = check(dispatch(Capability("", ("run_command",), (), None)), 0)
    assert reason is not None and "tenant" in reason
