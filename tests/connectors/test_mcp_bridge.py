"""The MCP bridge against a real MCP server (the SDK's MCPServer, as a subprocess): each
test of a call runs over stdio and over streamable HTTP (`server` is parametrized);
what only one transport has is tested on its own (`test_mcp_bridge_http.py` for HTTP)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from mcp import StdioServerParameters

from tests.connectors.e2e_tools import run_agent
from tests.connectors.mcp_server import SERVER, http_server, stdio_server
from tests.connectors.test_http_tool import Handler
from torpor.connectors.mcp_bridge import McpBridge, McpServer, discover_blocking, from_env, result_of, spec_of
from torpor.schemas.errors import ConfigError
from torpor.schemas.ids import derive_id
from torpor.schemas.records import (
    Capability,
    Dispatch,
    EventEntry,
    Input,
    TextBlock,
    ToolResult,
    ToolResultEntry,
    ToolSpec,
)

PREFIX = "demo_"
TOOLS = ("add", "shout", "fail", "slow", "pid")
ALLOWED = Capability("local", tuple(PREFIX + t for t in TOOLS), (), None)


__all__ = ["SERVER"]  # test_acceptance_kafka's MCP server


@pytest.fixture(scope="module")
def stdio(tmp_path_factory: pytest.TempPathFactory) -> StdioServerParameters:
    return stdio_server(tmp_path_factory)


@pytest.fixture(scope="module", params=["stdio", "http"])
def server(request: pytest.FixtureRequest, stdio: StdioServerParameters,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpServer]:
    if request.param == "stdio":
        yield stdio
    else:
        for running in http_server(tmp_path_factory):
            yield running.url


@pytest.fixture(scope="module")
def specs(server: McpServer) -> tuple[ToolSpec, ...]:
    return discover_blocking(server, PREFIX)


def dispatch(tool: str, arguments: object, request_id: str, capability: Capability = ALLOWED,
             kind: str = "invoke", call_id: str | None = None) -> Dispatch:
    return Dispatch(request_id, "t1", call_id or f"call-{request_id}", PREFIX + tool, json.dumps(arguments),
                    capability, 0, 1, None, kind)


def clock() -> int:
    return time.time_ns() // 1_000_000


def serve(server: McpServer, specs: tuple[ToolSpec, ...],
          script: Callable[[McpBridge, list[Input]], Awaitable[None]], timeout_s: float = 5.0) -> list[Input]:
    received: list[Input] = []

    async def go() -> None:
        bridge = McpBridge(received.append, clock, server, specs, prefix=PREFIX, call_timeout_s=timeout_s)
        try:
            await script(bridge, received)
        finally:
            await bridge.close()

    asyncio.run(go())
    return received


# Generous: the server is a process, and a loaded machine may not schedule it for seconds.
async def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    end = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < end, "condition not reached in time"
        await asyncio.sleep(0.01)


def by_request(inputs: list[Input]) -> dict[str, ToolResult]:
    return {i.body.request_id: i.body for i in inputs if isinstance(i.body, ToolResult)}


def only_text(result: ToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, TextBlock)
    return block.text


def test_the_servers_tools_become_prefixed_specs_with_their_schemas(specs: tuple[ToolSpec, ...]) -> None:
    named = {spec.name: spec for spec in specs}
    assert set(named) == {PREFIX + t for t in TOOLS}
    add = named["demo_add"]
    assert add.description == "Add two integers." and add.toolset == "mcp:demo_"
    assert json.loads(add.parameters)["required"] == ["a", "b"]
    assert add.result_schema is not None and "result" in json.loads(add.result_schema)["properties"]
    assert named["demo_shout"].result_schema is None


def test_calls_map_results_errors_and_share_one_server_process(
    server: McpServer, specs: tuple[ToolSpec, ...]
) -> None:
    async def script(bridge: McpBridge, out: list[Input]) -> None:
        bridge.submit(dispatch("add", {"a": 2, "b": 40}, "r1"))
        bridge.submit(dispatch("shout", {"words": "hi there"}, "r2"))
        bridge.submit(dispatch("fail", {"why": "on purpose"}, "r3"))
        bridge.submit(dispatch("add", {"a": "not a number"}, "r4"))
        await until(lambda: len(out) == 4)
        bridge.submit(dispatch("pid", {}, "r5"))
        bridge.submit(dispatch("pid", {}, "r6"))
        await until(lambda: len(out) == 6)

    out = serve(server, specs, script)
    results = by_request(out)
    assert {i.message_id for i in out} == {derive_id(f"r{n}", "result") for n in range(1, 7)}
    assert results["r1"].ok and json.loads(only_text(results["r1"])) == {"result": 42}
    assert results["r2"].ok and only_text(results["r2"]) == "HI THERE"
    assert not results["r3"].ok and "fail" in only_text(results["r3"])
    assert not results["r4"].ok
    assert only_text(results["r5"]) == only_text(results["r6"])  # one session, not a process per call


def test_a_slow_tool_times_out_and_a_cancelled_call_never_answers(
    server: McpServer, specs: tuple[ToolSpec, ...]
) -> None:
    async def script(bridge: McpBridge, out: list[Input]) -> None:
        bridge.submit(dispatch("slow", {"seconds": 1.5}, "r1"))
        bridge.submit(dispatch("slow", {"seconds": 1.5}, "r2", call_id="call-2"))
        await until(lambda: bridge.busy == 2)
        bridge.submit(dispatch("slow", {}, "cancel-2", kind="cancel", call_id="call-2"))
        await until(lambda: len(out) == 1)
        await asyncio.sleep(0.2)  # room for a wrong answer to the cancelled call

    out = serve(server, specs, script, timeout_s=0.8)
    (result,) = out
    assert isinstance(result.body, ToolResult) and result.body.request_id == "r1"
    assert not result.body.ok and "no answer from the MCP server" in only_text(result.body)


def test_refusals_and_bad_arguments_do_not_reach_the_server(
    server: McpServer, specs: tuple[ToolSpec, ...]
) -> None:
    async def script(bridge: McpBridge, out: list[Input]) -> None:
        outside = Capability("local", ("echo",), (), None)
        bridge.submit(dispatch("add", {"a": 1, "b": 2}, "r1", capability=outside))
        bridge.submit(dispatch("nosuch", {}, "r2"))
        bridge.submit(dispatch("add", [1, 2], "r3"))
        await until(lambda: len(out) == 3)

    results = by_request(serve(server, specs, script))
    assert [results[r].ok for r in ("r1", "r2", "r3")] == [False] * 3
    assert "outside the capability" in only_text(results["r1"])
    assert "does not serve demo_nosuch" in only_text(results["r2"])
    assert "must be an object" in only_text(results["r3"])


def test_a_server_that_cannot_start_is_a_config_error_at_discovery_and_an_error_result(
    tmp_path: Path,
) -> None:
    missing = StdioServerParameters(command=str(tmp_path / "no-such-server"))
    with pytest.raises(ConfigError, match="cannot list the tools"):
        discover_blocking(missing, PREFIX)
    spec = ToolSpec("demo_add", "", "{}", None, False, None)

    async def script(bridge: McpBridge, out: list[Input]) -> None:
        bridge.submit(dispatch("add", {"a": 1, "b": 2}, "r1"))
        await until(lambda: len(out) == 1)

    (result,) = serve(missing, (spec,), script)
    assert isinstance(result.body, ToolResult) and not result.body.ok
    assert "MCP error" in only_text(result.body)


def test_from_env_needs_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORPOR_MCP_SERVER", raising=False)
    with pytest.raises(ConfigError, match="TORPOR_MCP_SERVER"):
        from_env(lambda _: None, clock)


def test_from_env_serves_the_command_line_server(
    monkeypatch: pytest.MonkeyPatch, stdio: StdioServerParameters
) -> None:
    monkeypatch.setenv("TORPOR_MCP_SERVER", f"{stdio.command} {stdio.args[0]}")
    monkeypatch.setenv("TORPOR_MCP_PREFIX", "env_")
    bridge = from_env(lambda _: None, clock)
    assert {spec.name for spec in bridge.specs} == {"env_" + t for t in TOOLS}


def test_discover_blocking_works_inside_a_running_loop(
    server: McpServer, specs: tuple[ToolSpec, ...]
) -> None:
    async def go() -> tuple[ToolSpec, ...]:
        return discover_blocking(server, PREFIX)

    assert asyncio.run(go()) == specs


def test_an_output_schema_without_structured_content_is_an_error() -> None:
    import mcp_types

    spec = spec_of(mcp_types.Tool(name="t", input_schema={"type": "object"},
                                  output_schema={"type": "object"}), "p_")
    ok, content = result_of(mcp_types.CallToolResult(content=[]), spec)
    assert not ok and "no structured content" in str(content)


def test_an_agent_in_local_mode_uses_the_subprocess_http_and_mcp_tools(stdio: StdioServerParameters) -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/agent"
        history = asyncio.run(run_agent(stdio, url))
    finally:
        httpd.shutdown()
        httpd.server_close()
    results = {e.body.name: e.body for e in history if isinstance(e.body, ToolResultEntry)}
    assert set(results) >= {"run_command", "http_request", "demo_add"}
    assert all(r.ok and r.origin == "tool" for r in results.values())
    assert json.loads(only_text_of(results["demo_add"].content)) == {"result": 42}
    status, _, body = only_text_of(results["http_request"].content).partition("\n\n")
    assert status.startswith("HTTP 200") and json.loads(body)["body"] == "from the agent"
    assert json.loads(body)["key"] is not None  # the dispatch's request id
    # The command's output reached the thread inline, then its exit code. (That it streams
    # while the command runs is shown without a clock by test_subprocess_tool's gate test.)
    streamed = [e for e in history if isinstance(e.body, EventEntry) and e.body.kind == "subscription_event"]
    output = "\n".join(only_text_of(e.body.content) for e in streamed if isinstance(e.body, EventEntry))
    assert "[stdout] first-line" in output and "[stderr] second-line" in output
    assert output.endswith("exit code 4")


def only_text_of(content: tuple[object, ...]) -> str:
    return "\n".join(block.text for block in content if isinstance(block, TextBlock))
