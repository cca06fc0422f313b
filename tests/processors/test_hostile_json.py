"""Hostile JSON from `inputs` (issue 16, items 7 and 8), folded through `step` over a store.

Deep tool-call arguments are a refused call, not a parked thread; a `CreateThread` whose
tool schema cannot be used is rejected before the thread exists; a regex in a tool's
schema cannot make a result or a call take exponential time.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.processors.fold_scenarios import SEARCH, completion, config, create, tool, user
from tests.processors.test_verify import KEY, RING, _input
from torpor.processors.fold.state import Status
from torpor.processors.fold.verify import KeyringVerifier
from torpor.processors.step import StepOutput, StepRecord, step
from torpor.processors.store.kv import MemoryStore
from torpor.processors.store.tables import load_state, read_entries
from torpor.schemas import signing
from torpor.schemas.records import (
    Input,
    InputBody,
    TextBlock,
    ToolCall,
    ToolResult,
    ToolResultEntry,
    ToolSpec,
)

REDOS: str = "^(a+)+$"
REDOS_TEXT: str = "a" * 5_000 + "!"  # backtracking needs ~2**5000 steps; RE2 one pass


class Thread:
    """Thread `t` folded by `step` over a `MemoryStore`, one input per call."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.offset = 0

    def send(self, body: InputBody, message_id: str, source: str = "user:u") -> StepOutput:
        record = Input(message_id, "t", 1_000 + self.offset, source, None, None, None, body)
        out = step(self.store, [StepRecord(record, partition=0, offset=self.offset)])
        self.offset += 1
        return out

    def answer(self, out: StepOutput, reply: str, calls: tuple[ToolCall, ...] = ()) -> StepOutput:
        (request,) = out.completions
        return self.send(completion(request.request_id, reply, calls), request.request_id, source="processor")


def _deep(levels: int) -> str:
    return '{"q": ' + "[" * levels + "]" * levels + "}"


def test_arguments_nested_50000_deep_are_a_refused_call_and_the_thread_goes_on() -> None:
    thread = Thread()
    out = thread.answer(thread.send(create(config()), "m-create"), "searching",
                        (ToolCall("c1", "search", _deep(50_000)),))
    assert [r.disposition for r in out.receipts] == ["applied"]
    assert out.parked == () and out.dispatches == ()
    state = load_state(thread.store, "t")
    assert state is not None and state.status is Status.AWAITING_MODEL and state.invalid_rounds == 1
    (refused,) = [e.body for e in read_entries(thread.store, "t") if isinstance(e.body, ToolResultEntry)]
    assert not refused.ok and refused.call_id == "c1"
    assert "invalid arguments for tool 'search': nested deeper than 64 levels" in refused.content[0].text
    after = thread.answer(out, "sorry, searching properly", (ToolCall("c2", "search", '{"q": "x"}'),))
    assert [r.disposition for r in after.receipts] == ["applied"]
    assert [d.tool for d in after.dispatches] == ["search"]
    assert thread.send(user("thanks"), "m-next").receipts[0].disposition == "applied"


BAD_PARAMETERS = [
    ("not JSON", "{", "parameters: not JSON"),
    ("not a schema", json.dumps({"type": "strin"}), "parameters: not a valid JSON Schema"),
    ("not an object schema", json.dumps({"type": "string"}), "parameters: not an object schema"),
    ("a backreference", json.dumps({"type": "object", "properties": {"q": {"pattern": "(a)\\1"}}}),
     "not supported by RE2"),
    ("a lookahead", json.dumps({"type": "object", "patternProperties": {"(?=x)": {}}}),
     "not supported by RE2"),
    ("a remote $ref", json.dumps({"type": "object", "properties": {"q": {"$ref": "http://127.0.0.1:9/x"}}}),
     "only local references"),
]


@pytest.mark.parametrize(("parameters", "why"), [(p, w) for _, p, w in BAD_PARAMETERS],
                         ids=[name for name, _, _ in BAD_PARAMETERS])
def test_a_create_thread_with_an_unusable_tool_schema_is_rejected_and_no_thread_exists(
        parameters: str, why: str) -> None:
    thread = Thread()
    bad = tool("broken", parameters)
    out = thread.send(create(config(tools=(SEARCH, bad), granted=("search", "broken"))), "m-create")
    (receipt,) = out.receipts
    assert receipt.disposition == "rejected:invalid_config"
    assert receipt.reason is not None and receipt.reason.startswith("broken: ") and why in receipt.reason
    assert load_state(thread.store, "t") is None and out.completions == () and out.changes == ()


def test_a_create_thread_with_an_unusable_result_schema_is_rejected() -> None:
    thread = Thread()
    bad = dataclasses.replace(tool("broken"), result_schema="[")
    (receipt,) = thread.send(create(config(tools=(bad,), granted=("broken",))), "m-create").receipts
    assert receipt.disposition == "rejected:invalid_config"
    assert receipt.reason is not None and receipt.reason.startswith("broken: result_schema: not JSON")


def test_a_child_copies_its_parents_tools_and_is_created() -> None:
    thread = Thread()
    out = thread.answer(thread.send(create(config()), "m-create"), "delegating",
                        (ToolCall("c1", "spawn_thread", '{"instructions": "look"}'),))
    (child,) = [i for i in out.loopbacks if i.thread_id != "t"]
    spawned = step(thread.store, [StepRecord(child)])
    assert [r.disposition for r in spawned.receipts] == ["applied"]


def test_a_backtracking_pattern_in_parameters_refuses_the_call_without_stalling() -> None:
    thread = Thread()
    guarded = tool("shout", json.dumps({"type": "object", "properties": {"text": {"type": "string",
                                                                                    "pattern": REDOS}}}))
    out = thread.send(create(config(tools=(guarded,), granted=("shout",))), "m-create")
    out = thread.answer(out, "shouting", (ToolCall("c1", "shout", json.dumps({"text": REDOS_TEXT})),))
    assert [r.disposition for r in out.receipts] == ["applied"] and out.dispatches == ()
    (refused,) = [e.body for e in read_entries(thread.store, "t") if isinstance(e.body, ToolResultEntry)]
    assert not refused.ok and "does not match '^(a+)+$'" in refused.content[0].text


def test_a_backtracking_pattern_in_a_result_schema_gives_an_invalid_verdict_without_stalling() -> None:
    thread = Thread()
    result_schema = json.dumps({"type": "string", "pattern": REDOS})
    counted = ToolSpec("lookup", "counts", SEARCH.parameters, result_schema, False, "test")
    out = thread.send(create(config(tools=(counted,), granted=("lookup",))), "m-create")
    thread.answer(out, "counting", (ToolCall("c1", "lookup", '{"q": "n"}'),))
    state = load_state(thread.store, "t")
    assert state is not None
    (pending,) = state.pending_calls
    body = ToolResult(call_id="c1", request_id=pending.request_id, ok=True,
                      content=(TextBlock(json.dumps(REDOS_TEXT)),), subscription=False)
    verdict = KeyringVerifier(RING).verify(signing.sign(_input(body), "tools-1", KEY), state)
    assert verdict.provenance == "invalid"
    assert verdict.reason.startswith("result_schema: data: ") and "does not match '^(a+)+$'" in verdict.reason


def test_deep_arguments_in_history_still_map_to_a_provider_request() -> None:
    from torpor.processors.models.providers.blocks import tool_input

    deep = _deep(50_000)
    assert tool_input(deep) == {"invalid_arguments": deep}
