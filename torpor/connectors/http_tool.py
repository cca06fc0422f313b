"""`http_request`: one HTTP request, with timeouts, a size limit and an idempotency key.

Arguments `{"method": str, "url": str, "headers": {str: str}, "body": str,
"timeout_s": number}`. The request carries `Idempotency-Key: <request_id>`, so a
retried dispatch (the connector runtime retries after a crash) is recognisable to a
server that honours the header. Only `http` and `https` URLs are accepted.

The result is one `ToolResult`: `HTTP <status> <reason>`, the response headers that
matter to a reader (content type and length), then the body as text, cut at
`MAX_RESPONSE_BYTES` with a line saying so (the body is streamed, so a huge response is
never held in memory). `ok` is true for a status below 400. A connect or read timeout,
a refused connection, a bad URL or bad arguments give an error result naming the cause;
nothing raises into the runtime. The dispatch's capability is checked first
(`capability.check`).
"""

from __future__ import annotations

from typing import Final

import httpx

from torpor.connectors.builtin import (
    BadArguments,
    BuiltinTool,
    arguments_object,
    builtin_spec,
    timeout_argument,
)
from torpor.connectors.inprocess import Clock, InputSink, text
from torpor.schemas.records import Dispatch

METHODS: Final = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
CONNECT_TIMEOUT_S: Final = 5.0
DEFAULT_READ_TIMEOUT_S: Final = 30.0
MAX_READ_TIMEOUT_S: Final = 300.0
MAX_RESPONSE_BYTES: Final = 64 * 1024
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"

HTTP_REQUEST_SPEC: Final = builtin_spec(
    "http_request",
    "Make an HTTP request and get the status, headers and (size-limited) body back.",
    {
        "type": "object",
        "properties": {
            "method": {"type": "string", "enum": list(METHODS)},
            "url": {"type": "string", "minLength": 1},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "body": {"type": "string"},
            "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_READ_TIMEOUT_S},
        },
        "required": ["url"],
        "additionalProperties": False,
    },
)


class Request:
    """A parsed, checked `http_request` call."""

    def __init__(self, arguments: str, idempotency_key: str) -> None:
        args = arguments_object(arguments)
        self.method = str(args.get("method", "GET")).upper()
        if self.method not in METHODS:
            raise BadArguments(f"method must be one of {', '.join(METHODS)}")
        url = args.get("url")
        if not isinstance(url, str):
            raise BadArguments("url must be a string")
        try:
            self.url = httpx.URL(url)
        except httpx.InvalidURL as error:
            raise BadArguments(f"bad url {url!r}: {error}") from error
        if self.url.scheme not in ("http", "https") or not self.url.host:
            raise BadArguments(f"url must be http(s)://host...: {url!r}")
        headers = args.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise BadArguments("headers must be an object of strings")
        # The key is ours to set: a caller's own value would break the retry guarantee.
        self.headers = {k: v for k, v in headers.items() if k.lower() != IDEMPOTENCY_HEADER.lower()}
        self.headers[IDEMPOTENCY_HEADER] = idempotency_key
        body = args.get("body")
        if body is not None and not isinstance(body, str):
            raise BadArguments("body must be a string")
        self.body = body.encode() if body is not None else None
        timeout = timeout_argument(args, DEFAULT_READ_TIMEOUT_S, MAX_READ_TIMEOUT_S)
        self.timeout = httpx.Timeout(timeout, connect=min(CONNECT_TIMEOUT_S, timeout))


def decode(body: bytes, charset: str | None) -> str:
    try:
        return body.decode(charset or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know: the server's problem, not a crash
        return body.decode("utf-8", errors="replace")


class HttpTool(BuiltinTool):
    name = "http"
    specs = (HTTP_REQUEST_SPEC,)
    max_response_bytes: int = MAX_RESPONSE_BYTES

    def __init__(
        self, sink: InputSink, clock: Clock, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        super().__init__(sink, clock)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def invoke(self, dispatch: Dispatch) -> None:
        if self.answer_if_refused(dispatch):
            return
        try:
            request = Request(dispatch.arguments, dispatch.request_id)
        except BadArguments as error:
            self.answer(dispatch, ok=False, content=text(f"http_request: {error}"))
            return
        self.start(dispatch, self._send(dispatch, request))

    def client(self) -> httpx.AsyncClient:
        # Created on first use, inside the running loop; redirects are not followed
        # because a redirect of a POST would repeat an effect somewhere else.
        if self._client is None:
            self._client = httpx.AsyncClient(
                transport=self._transport, follow_redirects=False, trust_env=False
            )
        return self._client

    async def _send(self, dispatch: Dispatch, request: Request) -> None:
        what = f"{request.method} {request.url}"
        try:
            async with self.client().stream(request.method, request.url, headers=request.headers,
                                            content=request.body, timeout=request.timeout) as response:
                body = bytearray()
                truncated = False
                async for chunk in response.aiter_bytes():
                    room = self.max_response_bytes - len(body)
                    if len(chunk) > room:
                        body += chunk[:room]
                        truncated = True
                        break
                    body += chunk
        except httpx.TimeoutException as error:
            kind = "connect" if isinstance(error, httpx.ConnectTimeout) else "read"
            self.answer(dispatch, ok=False, content=text(f"{what}: {kind} timeout ({type(error).__name__})"))
            return
        except httpx.HTTPError as error:
            self.answer(dispatch, ok=False, content=text(f"{what}: {type(error).__name__}: {error}"))
            return
        lines = [f"HTTP {response.status_code} {response.reason_phrase}"]
        for header in ("content-type", "content-length", "location"):
            if header in response.headers:
                lines.append(f"{header}: {response.headers[header]}")
        lines.append("")
        lines.append(decode(bytes(body), response.charset_encoding))
        if truncated:
            lines.append(f"[response truncated at {self.max_response_bytes} bytes]")
        self.answer(dispatch, ok=response.status_code < 400, content=text("\n".join(lines)))

    async def close(self) -> None:
        await super().close()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
