"""A real MCP server for the bridge's tests: the SDK's MCPServer, as a subprocess, over
stdio or streamable HTTP (uvicorn on a local port, optionally wanting a bearer token)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mcp import StdioServerParameters

# `add` has structured output, `shout` plain text, `fail` always errs, `slow` waits,
# `pid` tells whether the calls share one server process.
SERVER = '''
from __future__ import annotations

import os
import time

from mcp.server.mcpserver import MCPServer
from mcp_types import TextContent

app = MCPServer("torpor-test")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool(structured_output=False)
def shout(words: str) -> list[TextContent]:
    """Upper-case the words."""
    return [TextContent(type="text", text=words.upper())]


@app.tool()
def fail(why: str) -> str:
    """Always fails, saying why."""
    raise ValueError(why)


@app.tool()
def slow(seconds: float) -> str:
    """Answer after a while."""
    time.sleep(seconds)
    return "late"


@app.tool(structured_output=False)
def pid() -> list[TextContent]:
    """This server's process id."""
    return [TextContent(type="text", text=str(os.getpid()))]


def serve_http(port: int, token: str | None) -> None:
    """Streamable HTTP on 127.0.0.1:`port` (0: any), the port printed once it accepts; with
    `token`, a request without `Authorization: Bearer <token>` is refused with 401."""
    import socket

    import uvicorn
    from starlette.responses import PlainTextResponse

    mcp_app = app.streamable_http_app()

    async def guarded(scope, receive, send):
        headers = dict(scope.get("headers") or [])
        if scope["type"] == "http" and token is not None \
                and headers.get(b"authorization") != f"Bearer {token}".encode():
            await PlainTextResponse("no entry", status_code=401)(scope, receive, send)
            return
        await mcp_app(scope, receive, send)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    print(f"listening on {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(guarded, log_level="warning", lifespan="on")).run(sockets=[sock])


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--http":  # --http PORT [TOKEN]
        serve_http(int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        app.run()
'''


@dataclass
class HttpServerProcess:
    """`SERVER` serving streamable HTTP on a local port (0 until started: any free one)."""

    script: Path
    token: str | None = None
    port: int = 0
    process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        """Start it (on the same port as before, if it ran), once its socket listens."""
        args = [sys.executable, str(self.script), "--http", str(self.port)]
        self.process = subprocess.Popen([*args, *([self.token] if self.token else [])],
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("listening on "), line
        self.port = int(line.split()[-1])

    def kill(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def refuses_connections(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
        except OSError:
            return True
        return False


def script_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "server.py"
    path.write_text(SERVER)
    return path


def stdio_server(tmp_path_factory: pytest.TempPathFactory) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(script_file(tmp_path_factory))])


def http_server(tmp_path_factory: pytest.TempPathFactory,
                token: str | None = None) -> Iterator[HttpServerProcess]:
    """A started `HttpServerProcess`, killed when the generator is closed (a fixture's body)."""
    running = HttpServerProcess(script_file(tmp_path_factory), token)
    running.start()
    try:
        yield running
    finally:
        running.kill()
