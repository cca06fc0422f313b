"""`http_request` against a stdlib HTTP server on 127.0.0.1: status, body, limits, errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from torpor.connectors.http_tool import HttpTool
from torpor.schemas.ids import derive_id
from torpor.schemas.records import Capability, Dispatch, Input, TextBlock, ToolResult

ALLOWED = Capability("local", ("http_request",), (), None)
# /slow answers only once this is set: a call that ended before is one that timed out.
SLOW_RELEASED = threading.Event()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.answer()

    def do_POST(self) -> None:
        self.answer()

    def answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        received = self.rfile.read(length).decode()
        if self.path == "/slow":
            SLOW_RELEASED.wait(timeout=600)
        if self.path == "/big":
            payload = b"x" * 200_000
            status = 200
        else:
            status = 500 if self.path == "/fail" else 200
            payload = json.dumps({"method": self.command, "path": self.path, "body": received,
                                  "key": self.headers.get("Idempotency-Key"),
                                  "x": self.headers.get("X-Test")}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the client gave up (the timeout test)
            self.wfile.write(payload)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def dispatch(arguments: object, request_id: str = "req-1", capability: Capability = ALLOWED) -> Dispatch:
    return Dispatch(request_id, "t1", "call-1", "http_request", json.dumps(arguments), capability, 0, 1, None,
                    "invoke")


def clock() -> int:
    return time.time_ns() // 1_000_000


def call(*dispatches: Dispatch) -> list[ToolResult]:
    received: list[Input] = []

    async def go() -> None:
        tool = HttpTool(received.append, clock)
        try:
            for one in dispatches:
                tool.submit(one)
            end = asyncio.get_running_loop().time() + 60  # generous: a loaded machine
            while len(received) < len(dispatches):
                assert asyncio.get_running_loop().time() < end, "no answer in time"
                await asyncio.sleep(0.005)
        finally:
            await tool.close()

    asyncio.run(go())
    assert {i.message_id for i in received} == {derive_id(d.request_id, "result") for d in dispatches}
    by_request = {i.body.request_id: i.body for i in received if isinstance(i.body, ToolResult)}
    results = [by_request[d.request_id] for d in dispatches]
    return results


def content(result: ToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, TextBlock)
    return block.text


def test_a_post_carries_body_headers_and_the_request_id_as_idempotency_key(server: str) -> None:
    (result,) = call(dispatch({"method": "post", "url": f"{server}/items", "body": "hello",
                               "headers": {"X-Test": "yes", "idempotency-key": "forged"}}))
    assert result.ok and not result.subscription
    status, _, body = content(result).partition("\n\n")
    assert status.startswith("HTTP 200 OK") and "content-type: application/json" in status
    expected = {"method": "POST", "path": "/items", "body": "hello", "key": "req-1", "x": "yes"}
    assert json.loads(body) == expected


def test_an_error_status_is_an_error_result_with_the_body(server: str) -> None:
    (result,) = call(dispatch({"url": f"{server}/fail"}))
    assert not result.ok and content(result).startswith("HTTP 500")
    assert '"path": "/fail"' in content(result)


def test_a_large_response_is_truncated_and_says_so(server: str) -> None:
    (result,) = call(dispatch({"url": f"{server}/big"}))
    assert result.ok
    text = content(result)
    assert text.endswith("[response truncated at 65536 bytes]")
    assert text.count("x") == 65536


def test_a_read_timeout_is_an_error_result(server: str) -> None:
    try:
        # The server cannot answer before the release: a call that ends here ended by its timeout.
        (result,) = call(dispatch({"url": f"{server}/slow", "timeout_s": 0.2}))
    finally:
        SLOW_RELEASED.set()
    assert not result.ok and "read timeout" in content(result)


def test_a_refused_connection_is_an_error_result() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (result,) = call(dispatch({"url": f"http://127.0.0.1:{port}/"}))
    assert not result.ok and "ConnectError" in content(result)


def test_bad_arguments_and_a_capability_refusal_send_nothing(server: str) -> None:
    results = call(
        dispatch({"url": "file:///etc/passwd"}, "r1"),
        dispatch({"url": server, "method": "TRACE"}, "r2"),
        dispatch({"url": server, "headers": {"a": 1}}, "r3"),
        dispatch({"url": f"{server}/x"}, "r4", capability=Capability("local", ("echo",), (), None)),
    )
    assert [r.ok for r in results] == [False] * 4
    texts = [content(r) for r in results]
    assert "http(s)" in texts[0] and "method" in texts[1] and "headers" in texts[2]
    assert "outside the capability" in texts[3]
