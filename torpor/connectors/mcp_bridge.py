"""The MCP bridge: an MCP server's tools, served as Torpor tools.

Contract. `McpBridge(sink, clock, server, specs)` serves the tools of one MCP server,
reached over stdio (`StdioServerParameters`: the bridge launches the command) or
streamable HTTP (a URL string, or an `HttpServer`: a URL and headers to send with every
request, such as a bearer token), with the `mcp` SDK's `Client`. `discover(server,
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
an error result naming the cause (the innermost errors, not the task group that carried
them). `cancel` cancels the waiting call (the MCP request is abandoned; a late answer is
ignored). The capability is checked first. An HTTP server that went away is reached again
by the next call: its session ends with the connection, and the next call opens one.
Secrets (a password in the URL, header values) never appear in a repr or an error.

`torpor connector run torpor.connectors.mcp_bridge:from_env` serves the server named by
`TORPOR_MCP_SERVER` (a URL, or a command line run over stdio) with the prefix
`TORPOR_MCP_PREFIX` (default `mcp_`); for a URL, `TORPOR_MCP_HEADERS` may hold a JSON
object of headers (``{"Authorization": "Bearer ..."}``).
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
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import httpx2
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from torpor.connectors.capability import check
from torpor.connectors.inprocess import Clock, InProcessConnector, InputSink, text
from torpor.schemas.errors import ConfigError
from torpor.schemas.records import ContentBlock, Dispatch, ImageBlock, TextBlock, ToolSpec


@dataclass(frozen=True, slots=True)
class HttpServer:
    """A streamable HTTP MCP server that wants headers (a token) with every request.

    The header values are secrets: the repr shows the URL and the header names only."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"HttpServer({_redacted(self.url)!r}, headers={sorted(self.headers)})"

    __str__ = __repr__


McpServer = StdioServerParameters | str | HttpServer
"""Where the MCP server is: a command to launch over stdio, or a streamable HTTP URL."""

# What the SDK's own HTTP client uses: a server may hold a response stream open for long.
HTTP_TIMEOUT: Final = httpx2.Timeout(30.0, read=300.0)

DEFAULT_PREFIX: Final = "mcp_"
DEFAULT_CALL_TIMEOUT_S: Final = 60.0
DISCOVER_TIMEOUT_S: Final = 30.0
SERVER_ENV: Final = "TORPOR_MCP_SERVER"
PREFIX_ENV: Final = "TORPOR_MCP_PREFIX"
HEADERS_ENV: Final = "TORPOR_MCP_HEADERS"


def _redacted(url: str) -> str:
    """`url` without the password of its user info."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def _secrets(server: McpServer) -> list[str]:
    url = server.url if isinstance(server, HttpServer) else server if isinstance(server, str) else ""
    found = [urlsplit(url).password or ""] if url else []
    if isinstance(server, HttpServer):
        found += list(server.headers.values())
        # A bearer token is secret even where only its token part is quoted.
        found += [value.split(" ", 1)[1] for value in server.headers.values() if " " in value]
    return [secret for secret in found if len(secret) >= 4]


def describe(error: BaseException, server: McpServer, refusals: list[str] | None = None) -> str:
    """What went wrong, for a person: the innermost errors (a task group's are unwrapped),
    the HTTP status the server refused with, if it did (the SDK reports a 401 or a 500 as
    "an error response" only), and the server's secrets blanked."""
    leaves: list[str] = []

    def walk(found: BaseException) -> None:
        if isinstance(found, BaseExceptionGroup):
            for inner in found.exceptions:
                walk(inner)
            return
        line = f"{type(found).__name__}: {found}" if str(found) else type(found).__name__
        if line not in leaves:
            leaves.append(line)

    walk(error)
    text = "; ".join(leaves)
    if refusals:
        text += f" (the server answered {refusals[-1]})"
    for secret in _secrets(server):
        text = text.replace(secret, "***")
    return text


def where(server: McpServer) -> str:
    """The server, named for a message: its URL without a password, or its command line."""
    if isinstance(server, StdioServerParameters):
        return shlex.join([server.command, *server.args])
    return _redacted(server.url if isinstance(server, HttpServer) else server)


@contextlib.asynccontextmanager
async def connect(server: McpServer, refusals: list[str] | None = None) -> AsyncIterator[Client]:
    """An open `Client` for `server`, closed (its HTTP client too) when the block ends.

    Over HTTP, each status of 400 or more the server answers is appended to `refusals`
    (for `describe`)."""
    if isinstance(server, StdioServerParameters):
        async with Client(server) as client:
            yield client
        return
    url, headers = (server.url, dict(server.headers)) if isinstance(server, HttpServer) else (server, {})

    async def seen(response: httpx2.Response) -> None:
        if response.status_code >= 400 and refusals is not None:
            refusals.append(f"HTTP {response.status_code} {response.reason_phrase}".strip())

    hooks = {"response": [seen]}
    async with httpx2.AsyncClient(headers=headers, timeout=HTTP_TIMEOUT, event_hooks=hooks) as http, \
            Client(streamable_http_client(url, http_client=http)) as client:
        yield client


def spec_of(tool: mcp_types.Tool, prefix: str) -> ToolSpec:
    return ToolSpec(
        name=f"{prefix}{tool.name}",
        description=tool.description or tool.title or f"MCP tool {tool.name}",
        parameters=json.dumps(tool.input_schema, sort_keys=True),
        result_schema=json.dumps(tool.output_schema, sort_keys=True) if tool.output_schema else None,
        passive=False,
        toolset=f"mcp:{prefix}",
    )


async def discover(server: McpServer, prefix: str = DEFAULT_PREFIX,
                   refusals: list[str] | None = None) -> tuple[ToolSpec, ...]:
    """The server's tools, every page of the listing, as specs (`refusals`: see `connect`)."""
    specs: list[ToolSpec] = []
    async with connect(server, refusals) as client:
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
    refusals: list[str] = []

    def work() -> None:
        try:
            listing = discover(server, prefix, refusals)
            found.append(asyncio.run(asyncio.wait_for(listing, DISCOVER_TIMEOUT_S)))
        except BaseException as error:  # handed to the caller's thread below
            failed.append(error)

    thread = threading.Thread(target=work, name="mcp-discover", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise ConfigError(f"cannot list the tools of MCP server {where(server)}: "
                          f"{describe(failed[0], server, refusals)}") from None
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
        self.refusals: list[str] = []  # HTTP statuses the server refused with (`connect`)
        self._ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._owner = asyncio.get_running_loop().create_task(self._own(), name="mcp-session")

    async def _own(self) -> None:
        try:
            async with connect(self._server, self.refusals) as client:
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


class _OpenFailed(Exception):
    """A session did not open; `__cause__` says why, `refusals` what HTTP statuses came back."""

    def __init__(self, refusals: list[str]) -> None:
        super().__init__("the MCP session did not open")
        self.refusals = list(refusals)


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

    async def _opened(self) -> tuple[_Session, Client]:
        """The shared session (opened, or opened again if it ended) and its client."""
        async with self._opening:
            if self._session is None or not self._session.alive:
                if self._session is not None:
                    await self._session.close()
                self._session = _Session(self._server)
            session = self._session
        try:
            return session, await session.client()
        except Exception as error:  # the session's own refusals say why it did not open
            raise _OpenFailed(session.refusals) from error

    async def _call(self, dispatch: Dispatch, spec: ToolSpec, arguments: dict[str, Any]) -> None:
        mcp_name = spec.name.removeprefix(self._prefix)
        refusals: list[str] = []
        try:
            session, client = await asyncio.wait_for(self._opened(), self._timeout)
            mark = len(session.refusals)
            try:
                result = await asyncio.wait_for(client.call_tool(mcp_name, arguments), self._timeout)
            finally:
                refusals = session.refusals[mark:]  # this call's, not an earlier one's
        except TimeoutError:
            self.answer(dispatch, ok=False, content=text(f"{spec.name}: no answer from the MCP server in "
                                                         f"{self._timeout:g} s"))
            return
        except Exception as error:  # the transport or the protocol: the model must hear of it
            cause: BaseException = error
            if isinstance(error, _OpenFailed):
                refusals, cause = error.refusals, error.__cause__ or error
            why = f"{spec.name}: MCP error: {describe(cause, self._server, refusals)}"
            self.answer(dispatch, ok=False, content=text(why))
            return
        ok, content = result_of(result, spec)
        self.answer(dispatch, ok=ok, content=content)

    async def close(self) -> None:
        await super().close()
        if self._session is not None:
            await self._session.close()
            self._session = None


def server_from_text(value: str, headers: Mapping[str, str] | None = None) -> McpServer:
    """A URL is a streamable HTTP server (with `headers`, an `HttpServer`); anything else is
    a command line run over stdio. `ConfigError` for headers with a command line."""
    if value.startswith(("http://", "https://")):
        return value if headers is None else HttpServer(value, dict(headers))
    if headers is not None:
        raise ConfigError(f"{HEADERS_ENV} is only for a URL in {SERVER_ENV}, not a command line")
    argv = shlex.split(value)
    if not argv:
        raise ConfigError(f"{SERVER_ENV} is empty: give a URL or a command line")
    return StdioServerParameters(command=argv[0], args=argv[1:])


def headers_from_text(value: str | None) -> dict[str, str] | None:
    """The headers of `TORPOR_MCP_HEADERS` (a JSON object of strings); None if unset.

    `ConfigError` naming the variable, never its value (it holds secrets), for anything else."""
    if value is None or not value.strip():
        return None
    try:
        found = json.loads(value)
    except ValueError:
        found = None
    if not isinstance(found, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in found.items()):
        raise ConfigError(f'{HEADERS_ENV} must be a JSON object of strings, e.g. {{"Authorization": '
                          '"Bearer ..."}} (its value is not shown: it may hold a secret)')
    return found


def from_env(sink: InputSink, clock: Clock) -> McpBridge:
    """The factory for `torpor connector run`: the server in TORPOR_MCP_SERVER."""
    value = os.environ.get(SERVER_ENV, "").strip()
    if not value:
        raise ConfigError(f"set {SERVER_ENV} to the MCP server's URL or command line")
    prefix = os.environ.get(PREFIX_ENV, DEFAULT_PREFIX)
    server = server_from_text(value, headers_from_text(os.environ.get(HEADERS_ENV)))
    return McpBridge(sink, clock, server, discover_blocking(server, prefix), prefix=prefix)
