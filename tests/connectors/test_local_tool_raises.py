"""Local mode, a tool that raises when it is handed its call: the call is answered with
the tool's error, and the call dispatched after it in the same step still runs.

Local mode has no effect journal: the outbox position moves past a step's dispatches
before they are handed out, so a tool raising there used to lose every later dispatch of
the step (the thread waited forever for their results) and stop the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

from torpor.connectors.echo import ECHO_SPEC, EchoTool
from torpor.connectors.router import ToolRouter
from torpor.processors.local import LocalConfig, LocalRuntime, now_ms
from torpor.processors.models.provider import ScriptedCall, ScriptedModel, ScriptedTurn, ScriptRule
from torpor.schemas.records import (
    Budgets,
    Capability,
    CreateThread,
    Dispatch,
    Input,
    TextBlock,
    ThreadConfig,
    ToolResult,
    UserMessage,
)

THREAD = "raises"
BOOM_SPEC = dataclasses.replace(ECHO_SPEC, name="boom", description="Raises when handed a call.")


class BoomTool(EchoTool):
    name = "boom"
    specs = (BOOM_SPEC,)

    def invoke(self, dispatch: Dispatch) -> None:
        raise RuntimeError(f"no {json.loads(dispatch.arguments)['text']} today")


def _config(router: ToolRouter) -> ThreadConfig:
    names = ("boom", "echo")
    return ThreadConfig(
        model="scripted", system_prompt="Use the tools.", tools=tuple(router.spec(n) for n in names),
        capability=Capability(tenant="local", tools=names, scopes=(), expires_at=None),
        budgets=Budgets(max_turns=None, max_children=None, max_tool_retries=2, max_invalid_calls=3),
        parent=None, context_window=200_000, compaction_threshold=0.8, allow_implicit_create=False)


async def _run() -> list[Input]:
    runtime: LocalRuntime

    def sink(record: Input) -> None:
        runtime.send(record)

    router = ToolRouter([BoomTool(sink, now_ms), EchoTool(sink, now_ms)], sink)
    calls = (ScriptedCall("boom", json.dumps({"text": "bang"})),
             ScriptedCall("echo", json.dumps({"text": "after", "delay_s": 0})))
    model = ScriptedModel(rules=(ScriptRule(turns=(ScriptedTurn(chunks=("Both.",), tool_calls=calls),),
                                            last_contains="go"),),
                          fallback=lambda _: ScriptedTurn(chunks=("noted",)))
    runtime = LocalRuntime(model, router, LocalConfig(store="memory"))
    try:
        for n, body in enumerate((CreateThread(config=_config(router), inherited=(), initial=()),
                                  UserMessage(content=(TextBlock("go"),)))):
            runtime.send(Input(f"raise:{n}", THREAD, now_ms(), "user:test", None, None, None, body))
        await asyncio.wait_for(runtime.run_until_idle(timeout_s=120), 150)
        return [r.value for r in runtime.inputs()]
    finally:
        await runtime.close()


def test_a_tool_raising_when_handed_its_call_is_answered_with_the_error_and_the_next_call_runs() -> None:
    inputs = asyncio.run(_run())
    results = {i.source: i.body for i in inputs if isinstance(i.body, ToolResult)}
    boom, echo = results["connector:boom"], results["connector:echo"]
    assert isinstance(boom, ToolResult) and isinstance(echo, ToolResult)
    assert not boom.ok and "boom failed: RuntimeError: no bang today" in str(boom.content)
    assert echo.ok and "echo: after" in str(echo.content)
