"""Composition for the end-to-end tools test: local mode with run_command, http_request and MCP.

`run_agent(mcp_server, url, tmp)` creates one root thread whose scripted model calls the
three built-in tools at once; the connectors answer through the in-process log, exactly
as `torpor local` runs them (`torpor.cli.local.compose`), and the thread's stored history
is returned once local mode is idle. Local mode's `busy` counts the running command, so
"idle" means the command has ended and its last event has been folded.
"""

from __future__ import annotations

import asyncio
import json

from mcp import StdioServerParameters

from torpor.connectors.http_tool import HttpTool
from torpor.connectors.mcp_bridge import McpBridge, discover_blocking
from torpor.connectors.router import ToolRouter
from torpor.connectors.subprocess_tool import SubprocessTool
from torpor.processors.local import LocalConfig, LocalRuntime, now_ms
from torpor.processors.models.provider import ScriptedCall, ScriptedModel, ScriptedTurn, ScriptRule
from torpor.processors.store.tables import read_entries
from torpor.schemas.records import (
    Budgets,
    Capability,
    CreateThread,
    HistoryEntry,
    Input,
    TextBlock,
    ThreadConfig,
    UserMessage,
)

THREAD = "e2e-tools"
COMMAND = "echo first-line; sleep 0.3; echo second-line >&2; exit 4"


def script(url: str) -> ScriptedModel:
    calls = (
        ScriptedCall("run_command", json.dumps({"command": COMMAND, "timeout_s": 10})),
        ScriptedCall("http_request", json.dumps({"method": "POST", "url": url, "body": "from the agent"})),
        ScriptedCall("demo_add", json.dumps({"a": 20, "b": 22})),
    )
    first = ScriptRule(turns=(ScriptedTurn(chunks=("Using all three tools.",), tool_calls=calls),),
                       last_contains="use the tools")
    # Every later wake-up (a result, an output event) is answered with plain text.
    return ScriptedModel(rules=(first,), fallback=lambda _: ScriptedTurn(chunks=("noted",)))


async def run_agent(mcp_server: StdioServerParameters, url: str) -> list[HistoryEntry]:
    runtime: LocalRuntime

    def sink(record: Input) -> None:
        runtime.send(record)

    mcp = McpBridge(sink, now_ms, mcp_server, discover_blocking(mcp_server, "demo_"), prefix="demo_")
    router = ToolRouter([SubprocessTool(sink, now_ms), HttpTool(sink, now_ms), mcp], sink)
    runtime = LocalRuntime(script(url), router, LocalConfig(store="memory"))
    names = ("run_command", "http_request", "demo_add")
    config = ThreadConfig(
        model="scripted",
        system_prompt="Use the tools.",
        tools=tuple(router.spec(name) for name in names),
        capability=Capability(tenant="local", tools=names, scopes=(), expires_at=None),
        budgets=Budgets(max_turns=None, max_children=None, max_tool_retries=2, max_invalid_calls=3),
        parent=None,
        context_window=200_000,
        compaction_threshold=0.8,
        allow_implicit_create=False,
    )
    try:
        for n, body in enumerate((CreateThread(config=config, inherited=(), initial=()),
                                  UserMessage(content=(TextBlock("please use the tools"),)))):
            runtime.send(Input(f"e2e:{n}", THREAD, now_ms(), "user:test", None, None, None, body))
        # The MCP call answers within its own timeout (60 s); the idle loop is the backstop,
        # generous because a loaded 2-core machine starts three tool processes slowly.
        await asyncio.wait_for(runtime.run_until_idle(timeout_s=180), 200)
        return list(read_entries(runtime.stores[0], THREAD))
    finally:
        await runtime.close()
