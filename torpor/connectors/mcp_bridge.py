"""The MCP bridge: an MCP server's tools, served as Torpor tools.

Contract. `McpBridge(sink, clock, server, specs)` serves the tools of one MCP server,
reached over stdio (`StdioServerParameters`: the bridge launches the command) or
streamable HTTP (a URL string), with the `mcp` SDK's `Client`. `discover(server,
prefix)` lists the server's tools as `ToolSpec`s named `<prefix><tool>` (toolset
`mcp:<prefix>`); `discover_blocking` does the same from synchronous code (a factory),
in a thread of its own so it works whether or not an event loop is running.

One session is kept open and shared by the calls (a stdio server is one process, not
one per call); it is opened on the first call and opened again after it fails. A call
maps the MCP result to one `ToolResult`: `isError` gives `ok=false`; text content is
kept as text, images as `ImageBlock`s, other content (audio, resources) is described in
text. A tool with an output schema declares it as its `result_schema`, and its result
is then the JSON of the structured content (what the processor's verifier checks). A
transport failure, a timeout (`call_timeout_s`) or a tool the server no longer has is
an error result naming the cause. `cancel` cancels the waiting call (the MCP request
is abandoned; a late answer is ignored). The capability is checked first.

`torpor connector run torpor.connectors.mcp_bridge:from_env` serves the server named by
`TORPOR_MCP_SERVER` (a URL, or a command line run over stdio) with the prefix
`TORPOR_MCP_PREFIX` (default `mcp_`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import os
import shlex
import threading
from typing import Any, Final

import mcp_types
from mcp import Client, StdioServerParameters

from torpor.connectors.capability import check
from torpor.connectors.inprocess import Clock, InProcessConnector, InputSink, text
from torpor.schemas.errors import ConfigError
from torpor.schemas.records import ContentBlock, Dispatch, ImageBlock, TextBlock, ToolSpec

McpServer = StdioServerParameters | str
"""Where the MCP server is: a command to launch over stdio, or a streamable HTTP URL."""

DEFAULT_PREFIX: Final = "mcp_"
DEFAULT_CALL_TIMEOUT_S: Final = 60.0
DISCOVER_TIMEOUT_S: Final = 30.0
SERVER_ENV: Final = "TORPOR_MCP_SERVER"
PREFIX_ENV: Final = "TORPOR_MCP_PREFIX"


def spec_of(tool: mcp_types.Tool, prefix: str) -> ToolSpec:
    return ToolSpec(
        name=f"{prefix}{tool.name}",
        description=tool.description or tool.title or f"MCP tool {tool.name}",
        parameters=json.dumps(tool.input_schema, sort_keys=True),
        result_schema=json.dumps(tool.output_schema, sort_keys=True) if tool.output_schema else None,
        passive=False,
        toolset=f"mcp:{prefix}",
    )


async def discover(server: McpServer, prefix: str = DEFAULT_PREFIX) -> tuple[ToolSpec, ...]:
    """The server's tools, every page of the listing, as specs."""
    specs: list[ToolSpec] = []
    async with Client(server) as client:
        cursor: str | None = None
        while True:
            listing = await client.list_tools(cursor=cursor)
            specs.extend(spec_of(tool, prefix) for tool in listing.tools)
            cursor = listing.next_cursor
            if cursor is None:
                break
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"MCP server lists a tool name twice: {sorted(names)}")
    return tuple(specs)


def discover_blocking(server: McpServer, prefix: str = DEFAULT_PREFIX) -> tuple[ToolSpec, ...]:
    """`discover` from synchronous code, even inside a running loop (a connector factory)."""
    found: list[tuple[ToolSpec, ...]] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            found.append(asyncio.run(asyncio.wait_for(discover(server, prefix), DISCOVER_TIMEOUT_S)))
        except BaseException as error:  # handed to the caller's thread below
            failed.append(error)

    thread = threading.Thread(target=work, name="mcp-discover", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise ConfigError(f"cannot list the tools of MCP server {server!r}: {failed[0]!r}") from failed[0]
    return found[0]


def content_of(block: object) -> ContentBlock:
    if isinstance(block, mcp_types.TextContent):
        return TextBlock(block.text)
    if isinstance(block, mcp_types.ImageContent):
        try:
            return ImageBlock(block.mime_type, base64.b64decode(block.data, validate=True))
        except (binascii.Error, ValueError):
            return TextBlock(f"[an image ({block.mime_type}) whose data is not base64]")
    if isinstance(block, mcp_types.AudioContent):
        return TextBlock(f"[audio ({block.mime_type}), {len(block.data) * 3 // 4} bytes: not shown]")
    if isinstance(block, mcp_types.ResourceLink):
        return TextBlock(f"[resource link {block.uri}]")
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            return TextBlock(f"[resource {resource.uri}]\n{resource.text}")
        return TextBlock(f"[binary resource {resource.uri}: not shown]")
    return TextBlock(f"[MCP content of type {type(block).__name__}: not shown]")


def result_of(result: mcp_types.CallToolResult, spec: ToolSpec) -> tuple[bool, tuple[ContentBlock, ...]]:
    """(ok, content) of a Torpor result for an MCP `CallToolResult`."""
    if result.is_error:
        return False, tuple(content_of(block) for block in result.content) or text("the MCP tool failed")
    if spec.result_schema is not None:
        # The processor checks a declared result schema against the result's JSON text.
        if result.structured_content is None:
            return False, text(f"{spec.name} declares an output schema but returned no structured content")
        return True, text(json.dumps(result.structured_content, sort_keys=True))
    return True, tuple(content_of(block) for block in result.content) or text("(no content)")


class _Session:
    """One open MCP client, owned by a task (the SDK's context must be entered and left there)."""

    def __init__(self, server: McpServer) -> None:
        self._server = server
        self._ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._owner = asyncio.get_running_loop().create_task(self._own(), name="mcp-session")

    async def _own(self) -> None:
        try:
            async with Client(self._server) as client:
                self._ready.set_result(client)
                await self._stop.wait()
        except BaseException as error:
            if not self._ready.done():
                self._ready.set_exception(error)
            if not isinstance(error, Exception):
                raise
        finally:
            if not self._ready.done():
                self._ready.set_exception(ConnectionError("MCP session closed"))

    @property
    def alive(self) -> bool:
        return not self._owner.done()

    async def client(self) -> Client:
        return await asyncio.shield(self._ready)

    async def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(self._owner, 5.0)
        # A failed session's error was handed to its callers; retrieve it so asyncio does not log it.
        if self._ready.done() and not self._ready.cancelled():
            self._ready.exception()


class McpBridge(InProcessConnector):
    name = "mcp"
    required_scopes: tuple[str, ...] = ()

    def __init__(
        self, sink: InputSink, clock: Clock, server: McpServer, specs: tuple[ToolSpec, ...],
        prefix: str = DEFAULT_PREFIX, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        super().__init__(sink, clock)
        self.specs = specs
        self._server = server
        self._prefix = prefix
        self._by_name = {spec.name: spec for spec in specs}
        self._timeout = call_timeout_s
        self._session: _Session | None = None
        self._opening = asyncio.Lock()

    def invoke(self, dispatch: Dispatch) -> None:
        spec = self._by_name.get(dispatch.tool)
        if spec is None:
            self.answer(dispatch, ok=False, content=text(f"the MCP bridge does not serve {dispatch.tool}"))
            return
        refusal = check(dispatch, self._clock(), self.required_scopes)
        if refusal is not None:
            self.answer(dispatch, ok=False, content=text(refusal))
            return
        try:
            arguments = json.loads(dispatch.arguments or "{}")
        except ValueError as error:
            self.answer(dispatch, ok=False, content=text(f"{dispatch.tool}: arguments are not JSON: {error}"))
            return
        if not isinstance(arguments, dict):
            self.answer(dispatch, ok=False, content=text(f"{dispatch.tool}: arguments must be an object"))
            return
        self.start(dispatch, self._call(dispatch, spec, arguments))

    async def _client(self) -> Client:
        async with self._opening:
            if self._session is None or not self._session.alive:
                if self._session is not None:
                    await self._session.close()
                self._session = _Session(self._server)
            session = self._session
        return await session.client()

    async def _call(self, dispatch: Dispatch, spec: ToolSpec, arguments: dict[str, Any]) -> None:
        mcp_name = spec.name.removeprefix(self._prefix)
        try:
            client = await asyncio.wait_for(self._client(), self._timeout)
            result = await asyncio.wait_for(client.call_tool(mcp_name, arguments), self._timeout)
        except TimeoutError:
            self.answer(dispatch, ok=False, content=text(f"{spec.name}: no answer from the MCP server in "
                                                         f"{self._timeout:g} s"))
            return
        except Exception as error:  # the transport or the protocol: the model must hear of it
            why = f"{spec.name}: MCP error: {type(error).__name__}: {error}"
            self.answer(dispatch, ok=False, content=text(why))
            return
        ok, content = result_of(result, spec)
        self.answer(dispatch, ok=ok, content=content)

    async def close(self) -> None:
        await super().close()
        if self._session is not None:
            await self._session.close()
            self._session = None


def server_from_text(value: str) -> McpServer:
    """A URL is a streamable HTTP server; anything else is a command line run over stdio."""
    if value.startswith(("http://", "https://")):
        return value
    argv = shlex.split(value)
    if not argv:
        raise ConfigError(f"{SERVER_ENV} is empty: give a URL or a command line")
    return StdioServerParameters(command=argv[0], args=argv[1:])


def from_env(sink: InputSink, clock: Clock) -> McpBridge:
    """The factory for `torpor connector run`: the server in TORPOR_MCP_SERVER."""
    value = os.environ.get(SERVER_ENV, "").strip()
    if not value:
        raise ConfigError(f"set {SERVER_ENV} to the MCP server's URL or command line")
    prefix = os.environ.get(PREFIX_ENV, DEFAULT_PREFIX)
    server = server_from_text(value)
    return McpBridge(sink, clock, server, discover_blocking(server, prefix), prefix=prefix)
