"""The tools connector of the Kafka acceptance test: run_command, http_request and an MCP server.

`tools(sink, clock)` is a connector factory for `torpor connector run`: one process
serving the subprocess runner, the HTTP tool and the MCP bridge (server from
`TORPOR_MCP_SERVER`, tools prefixed `demo_`) behind a `ToolRouter`.
"""

from __future__ import annotations

import os

from torpor.connectors.http_tool import HttpTool
from torpor.connectors.inprocess import Clock, InputSink
from torpor.connectors.mcp_bridge import McpBridge, discover_blocking, server_from_text
from torpor.connectors.router import ToolRouter
from torpor.connectors.subprocess_tool import SubprocessTool

PREFIX = "demo_"


def tools(sink: InputSink, clock: Clock) -> ToolRouter:
    server = server_from_text(os.environ["TORPOR_MCP_SERVER"])
    mcp = McpBridge(sink, clock, server, discover_blocking(server, PREFIX), prefix=PREFIX)
    return ToolRouter([SubprocessTool(sink, clock), HttpTool(sink, clock), mcp], sink)
