"""Function tools (`@tool`, `toolset`): results, JSON, errors, blocking functions, reconcile."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from tests.connectors.test_local_tools import dispatch, run, until
from torpor.connectors.functions import Call, FunctionTool, tool, toolset
from torpor.schemas.records import Input, TextBlock, ToolResult

ADD_PARAMETERS = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                  "required": ["a", "b"]}


@tool(description="Add two integers.", parameters=ADD_PARAMETERS, toolset="math")
async def add(args: dict[str, Any], call: Call) -> int:
    return int(args["a"]) + int(args["b"])


@tool(description="Split a text into words.", name="words", toolset="math")
def split(args: dict[str, Any], call: Call) -> dict[str, object]:
    time.sleep(0.01)  # a plain function may block: it runs in a worker thread
    return {"words": str(args["text"]).split(), "thread": call.thread_id}


@tool(description="Always fails.", toolset="math")
async def broken(args: dict[str, Any], call: Call) -> str:
    raise RuntimeError("the disk is full")


@tool(description="Writes somewhere else.", toolset="math")
async def record(args: dict[str, Any], call: Call) -> str:
    LEDGER.append(call.request_id)
    return "recorded"


LEDGER: list[str] = []


@record.reconciler
def _already(call: Call) -> str | None:
    return "recorded earlier" if call.request_id in LEDGER else None


MATH = toolset("math", add, split, broken, record)


def _result(record: Input) -> tuple[bool, str]:
    body = record.body
    assert isinstance(body, ToolResult)
    return body.ok, " ".join(b.text for b in body.content if isinstance(b, TextBlock))


def test_a_decorated_function_is_a_tool_spec_and_a_connector_factory() -> None:
    assert isinstance(add, FunctionTool)
    assert add.spec.name == "add" and json.loads(add.spec.parameters) == ADD_PARAMETERS
    assert split.spec.name == "words"
    connector = MATH(lambda record: None, lambda: 0)
    assert connector.source == "connector:math"
    assert [s.name for s in connector.specs] == ["add", "words", "broken", "record"]
    assert add(lambda record: None, lambda: 0).tools == frozenset({"add"})


def test_results_are_text_or_json_and_errors_reach_the_model() -> None:
    async def go(out: list[Input]) -> None:
        connector = MATH(out.append, lambda: 5)
        connector.submit(dispatch("add", {"a": 2, "b": 3}, request_id="r1", call_id="c1"))
        connector.submit(dispatch("words", {"text": "a b c"}, request_id="r2", call_id="c2"))
        connector.submit(dispatch("broken", {}, request_id="r3", call_id="c3"))
        await until(lambda: len(out) == 3)

    received = {r.body.request_id: _result(r) for r in run(go) if isinstance(r.body, ToolResult)}
    assert received["r1"] == (True, "5")
    assert json.loads(received["r2"][1]) == {"thread": "t1", "words": ["a", "b", "c"]}
    assert received["r3"] == (False, "broken failed: RuntimeError: the disk is full")


def test_a_cancel_stops_the_call_and_nothing_is_answered() -> None:
    @tool(description="Slow.")
    async def slow(args: dict[str, Any], call: Call) -> str:
        await asyncio.sleep(30)
        return "late"

    async def go(out: list[Input]) -> None:
        connector = slow(out.append, lambda: 0)
        connector.submit(dispatch("slow", {}))
        await until(lambda: connector.busy == 1)
        connector.submit(dispatch("slow", {}, kind="cancel", request_id="cancel-1"))
        await until(lambda: connector.busy == 0)

    assert run(go) == []


def test_the_reconciler_answers_for_an_effect_that_happened_and_declines_otherwise() -> None:
    LEDGER.clear()
    LEDGER.append("done-before")

    async def go(out: list[Input]) -> None:
        connector = MATH(out.append, lambda: 0)
        assert connector.reconcile(dispatch("record", {}, request_id="done-before"))
        assert not connector.reconcile(dispatch("record", {}, request_id="never-ran"))
        assert not connector.reconcile(dispatch("add", {"a": 1, "b": 1}))  # no reconciler: run again

    (answer,) = run(go)
    assert _result(answer) == (True, "recorded earlier")


def test_a_toolset_refuses_two_tools_of_one_name() -> None:
    with pytest.raises(ValueError, match="twice"):
        toolset("dup", add, add)
