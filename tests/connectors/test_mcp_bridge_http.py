"""What only the MCP bridge's streamable HTTP transport has, against a real MCP server (the
SDK's MCPServer under uvicorn, a subprocess on a local port): a server that goes away and
comes back, one that wants a bearer token, credentials in a URL, headers from the
environment. The calls themselves run over both transports in `test_mcp_bridge.py`."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator

import pytest
from mcp import StdioServerParameters

from tests.connectors.mcp_server import HttpServerProcess, http_server, stdio_server
from tests.connectors.test_mcp_bridge import (
    PREFIX,
    TOOLS,
    by_request,
    clock,
    dispatch,
    only_text,
    serve,
    until,
)
from tests.waiting import wait_until
from torpor.connectors.mcp_bridge import (
    HttpServer,
    McpBridge,
    discover_blocking,
    from_env,
    server_from_text,
)
from torpor.schemas.errors import ConfigError
from torpor.schemas.records import Input, ToolSpec

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServerProcess]:
    yield from http_server(tmp_path_factory)


@pytest.fixture(scope="module")
def specs(http: HttpServerProcess) -> tuple[ToolSpec, ...]:
    return discover_blocking(http.url, PREFIX)


def test_the_tools_over_http_are_the_tools_over_stdio(
    specs: tuple[ToolSpec, ...], tmp_path_factory: pytest.TempPathFactory
) -> None:
    assert specs == discover_blocking(stdio_server(tmp_path_factory), PREFIX)


@pytest.fixture
def restartable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServerProcess]:
    yield from http_server(tmp_path_factory)


def test_a_server_gone_is_an_error_result_naming_why_and_its_return_is_served(
    restartable: HttpServerProcess, specs: tuple[ToolSpec, ...]
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


def test_from_env_serves_a_url(http: HttpServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORPOR_MCP_SERVER", http.url)
    monkeypatch.setenv("TORPOR_MCP_PREFIX", "env_")
    monkeypatch.delenv("TORPOR_MCP_HEADERS", raising=False)
    bridge = from_env(lambda _: None, clock)
    assert {spec.name for spec in bridge.specs} == {"env_" + t for t in TOOLS}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServerProcess]:
    yield from http_server(tmp_path_factory, TOKEN)


def test_a_server_that_wants_a_token_is_served_with_it_and_the_token_never_shows(
    guarded: HttpServerProcess,
) -> None:
    with pytest.raises(ConfigError) as refused:
        discover_blocking(guarded.url, PREFIX)
    assert "401" in str(refused.value)
    server = HttpServer(guarded.url, {"Authorization": f"Bearer {TOKEN}"})
    assert TOKEN not in repr(server) and TOKEN not in str(server)
    specs = discover_blocking(server, PREFIX)

    async def script(bridge: McpBridge, out: list[Input]) -> None:
        bridge.submit(dispatch("add", {"a": 1, "b": 2}, "r1"))
        await until(lambda: len(out) == 1)

    assert by_request(serve(server, specs, script))["r1"].ok
    wrong = HttpServer(guarded.url, {"Authorization": "Bearer wrong-token"})
    with pytest.raises(ConfigError) as failed:
        discover_blocking(wrong, PREFIX)
    assert "wrong-token" not in str(failed.value) and "HTTP 401 Unauthorized" in str(failed.value)
    denied = by_request(serve(wrong, specs, script))["r1"]  # a call, the token revoked since discovery
    why = only_text(denied)
    assert not denied.ok and "HTTP 401 Unauthorized" in why and "wrong-token" not in why, why


def test_credentials_in_a_url_never_show_in_an_error(guarded: HttpServerProcess) -> None:
    url = guarded.url.replace("http://", "http://user:pa55word@")
    with pytest.raises(ConfigError) as failed:
        discover_blocking(url, PREFIX)
    assert "pa55word" not in str(failed.value) and "127.0.0.1" in str(failed.value)


def test_headers_come_from_the_environment_as_a_json_object(
    guarded: HttpServerProcess, monkeypatch: pytest.MonkeyPatch
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
