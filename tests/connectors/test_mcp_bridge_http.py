"""The MCP bridge over streamable HTTP, against a real MCP server (the SDK's MCPServer under
uvicorn, in a subprocess on a local port): the same tools as over stdio, a server that goes
away and comes back, and a server that wants a bearer token."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mcp import StdioServerParameters

from tests.connectors.test_mcp_bridge import (
    PREFIX,
    SERVER,
    TOOLS,
    by_request,
    clock,
    dispatch,
    only_text,
    until,
)
from tests.waiting import wait_until
from torpor.connectors.mcp_bridge import (
    HttpServer,
    McpBridge,
    McpServer,
    discover_blocking,
    from_env,
    server_from_text,
)
from torpor.schemas.errors import ConfigError
from torpor.schemas.records import Input, ToolSpec

TOKEN = "s3cret-token-for-tests"


@dataclass
class Running:
    """One MCP server process serving streamable HTTP on a local port."""

    script: Path
    token: str | None = None
    port: int = 0
    process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        args = [sys.executable, str(self.script), "--http", str(self.port)]
        self.process = subprocess.Popen([*args, *([self.token] if self.token else [])],
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # printed once the socket listens
        assert line.startswith("listening on "), line
        self.port = int(line.split()[-1])

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def refuses_connections(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
        except OSError:
            return True
        return False


def _running(tmp_path_factory: pytest.TempPathFactory, token: str | None) -> Iterator[Running]:
    script = tmp_path_factory.mktemp("mcp-http") / "server.py"
    script.write_text(SERVER)
    running = Running(script, token)
    running.start()
    try:
        yield running
    finally:
        running.kill()


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _running(tmp_path_factory, None)


@pytest.fixture(scope="module")
def specs(http: Running) -> tuple[ToolSpec, ...]:
    return discover_blocking(http.url, PREFIX)


def serve(server: McpServer, specs: tuple[ToolSpec, ...], script: object,
          timeout_s: float = 5.0) -> list[Input]:
    received: list[Input] = []

    async def go() -> None:
        bridge = McpBridge(received.append, clock, server, specs, prefix=PREFIX, call_timeout_s=timeout_s)
        try:
            await script(bridge, received)  # type: ignore[operator]
        finally:
            await bridge.close()

    asyncio.run(go())
    return received


def test_the_tools_over_http_are_the_tools_over_stdio(
    http: Running, specs: tuple[ToolSpec, ...], tmp_path: Path
) -> None:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    over_stdio = discover_blocking(StdioServerParameters(command=sys.executable, args=[str(script)]), PREFIX)
    assert {s.name for s in specs} == {PREFIX + t for t in TOOLS}
    assert specs == over_stdio


def test_calls_over_http_map_results_and_errors(http: Running, specs: tuple[ToolSpec, ...]) -> None:
    async def script(bridge: McpBridge, out: list[Input]) -> None:
        bridge.submit(dispatch("add", {"a": 2, "b": 40}, "r1"))
        bridge.submit(dispatch("shout", {"words": "hi there"}, "r2"))
        bridge.submit(dispatch("fail", {"why": "on purpose"}, "r3"))
        bridge.submit(dispatch("add", {"a": "not a number"}, "r4"))
        await until(lambda: len(out) == 4)

    results = by_request(serve(http.url, specs, script))
    assert results["r1"].ok and json.loads(only_text(results["r1"])) == {"result": 42}
    assert results["r2"].ok and only_text(results["r2"]) == "HI THERE"
    assert not results["r3"].ok and "fail" in only_text(results["r3"])
    assert not results["r4"].ok


def test_a_slow_call_over_http_times_out_and_a_cancelled_one_never_answers(
    http: Running, specs: tuple[ToolSpec, ...]
) -> None:
    async def script(bridge: McpBridge, out: list[Input]) -> None:
        bridge.submit(dispatch("slow", {"seconds": 1.5}, "r1"))
        bridge.submit(dispatch("slow", {"seconds": 1.5}, "r2", call_id="call-2"))
        await until(lambda: bridge.busy == 2)
        bridge.submit(dispatch("slow", {}, "cancel-2", kind="cancel", call_id="call-2"))
        await until(lambda: len(out) == 1)
        await until(lambda: bridge.busy == 0)  # the cancelled call is gone, and said nothing

    (result,) = serve(http.url, specs, script, timeout_s=0.8)
    assert result.body.request_id == "r1"  # type: ignore[union-attr]
    assert "no answer from the MCP server" in only_text(result.body)  # type: ignore[arg-type]


@pytest.fixture
def restartable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _running(tmp_path_factory, None)


def test_a_server_gone_is_an_error_result_naming_why_and_its_return_is_served(
    restartable: Running, specs: tuple[ToolSpec, ...]
) -> None:
    async def script(bridge: McpBridge, out: list[Input]) -> None:
        bridge.submit(dispatch("pid", {}, "before"))
        await until(lambda: len(out) == 1)
        restartable.kill()
        await asyncio.to_thread(wait_until, restartable.refuses_connections, 60, "the server's end")
        bridge.submit(dispatch("pid", {}, "gone"))
        await until(lambda: len(out) == 2)
        await asyncio.to_thread(restartable.start)  # the same port
        bridge.submit(dispatch("pid", {}, "back"))
        await until(lambda: len(out) == 3)

    results = by_request(serve(restartable.url, specs, script, timeout_s=20.0))
    assert results["before"].ok
    assert not results["gone"].ok
    why = only_text(results["gone"])
    assert why.startswith("demo_pid: MCP error: ") and "TaskGroup" not in why, why
    assert "Connect" in why or "Connection" in why, why  # the cause, not a wrapper
    assert results["back"].ok, only_text(results["back"])
    assert only_text(results["back"]) != only_text(results["before"])  # another server process


def test_from_env_serves_a_url(http: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORPOR_MCP_SERVER", http.url)
    monkeypatch.setenv("TORPOR_MCP_PREFIX", "env_")
    monkeypatch.delenv("TORPOR_MCP_HEADERS", raising=False)
    bridge = from_env(lambda _: None, clock)
    assert {spec.name for spec in bridge.specs} == {"env_" + t for t in TOOLS}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _running(tmp_path_factory, TOKEN)


def test_a_server_that_wants_a_token_is_served_with_it_and_the_token_never_shows(guarded: Running) -> None:
    with pytest.raises(ConfigError) as refused:
        discover_blocking(guarded.url, PREFIX)
    assert "401" in str(refused.value)
    server = HttpServer(guarded.url, {"Authorization": f"Bearer {TOKEN}"})
    assert TOKEN not in repr(server) and TOKEN not in str(server)
    specs = discover_blocking(server, PREFIX)

    async def script(bridge: McpBridge, out: list[Input]) -> None:
        bridge.submit(dispatch("add", {"a": 1, "b": 2}, "r1"))
        await until(lambda: len(out) == 1)

    (result,) = serve(server, specs, script)
    assert result.body.ok, result  # type: ignore[union-attr]
    wrong = HttpServer(guarded.url, {"Authorization": "Bearer wrong-token"})
    with pytest.raises(ConfigError) as failed:
        discover_blocking(wrong, PREFIX)
    assert "wrong-token" not in str(failed.value) and "HTTP 401 Unauthorized" in str(failed.value)
    (refused,) = serve(wrong, specs, script)  # a call, when the token is revoked after discovery
    assert not refused.body.ok  # type: ignore[union-attr]
    why = only_text(refused.body)  # type: ignore[arg-type]
    assert "HTTP 401 Unauthorized" in why and "wrong-token" not in why, why


def test_credentials_in_a_url_never_show_in_an_error(guarded: Running) -> None:
    url = guarded.url.replace("http://", "http://user:pa55word@")
    with pytest.raises(ConfigError) as failed:
        discover_blocking(url, PREFIX)
    assert "pa55word" not in str(failed.value) and "127.0.0.1" in str(failed.value)


def test_headers_come_from_the_environment_as_a_json_object(
    guarded: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORPOR_MCP_SERVER", guarded.url)
    monkeypatch.setenv("TORPOR_MCP_HEADERS", json.dumps({"Authorization": f"Bearer {TOKEN}"}))
    bridge = from_env(lambda _: None, clock)
    assert {spec.name for spec in bridge.specs} == {"mcp_" + t for t in TOOLS}
    for bad in ("not json", "[1, 2]", '{"Authorization": 5}'):
        monkeypatch.setenv("TORPOR_MCP_HEADERS", bad)
        with pytest.raises(ConfigError, match="TORPOR_MCP_HEADERS"):
            from_env(lambda _: None, clock)
    monkeypatch.setenv("TORPOR_MCP_SERVER", f"{sys.executable} -c pass")
    monkeypatch.setenv("TORPOR_MCP_HEADERS", "{}")
    with pytest.raises(ConfigError, match="only for a URL"):
        from_env(lambda _: None, clock)


def test_server_from_text_tells_urls_from_command_lines() -> None:
    assert server_from_text("https://example.test/mcp") == "https://example.test/mcp"
    assert isinstance(server_from_text("python server.py"), StdioServerParameters)
