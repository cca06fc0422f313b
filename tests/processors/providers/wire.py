"""A local HTTP/1.1 server that answers with scripted replies, byte for byte, for the adapters' tests.

`WireServer` serves one `Reply` per request, in order, and records each request
(method, path, headers, JSON body), so a test can point the real `openai` or
`anthropic` client at `http://127.0.0.1:<port>` and check both what was sent and what
the adapter made of the answer. A streamed reply uses chunked transfer encoding, as the
real APIs do, and can stall (keep the connection open, send nothing) or drop (close the
socket mid-body) after a given number of chunks.

`openai_sse` and `anthropic_sse` frame events as each API's server-sent events; the
`oai_*` and `ant_*` builders make the payloads in the shapes the real APIs send.

Run as a program, it is a stand-in endpoint for trying `torpor processor` by hand (the
commands of `docs/models.md`): `python -m tests.processors.providers.wire openai --port
8765 --fail 503` answers the first request with a 503, then every request with a short
streamed text turn, and prints one line per request it received.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

JSON = dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """One scripted answer. `body` parts are written as separate chunks when `stream`."""

    status: int = 200
    body: tuple[bytes, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    stream: bool = True
    stall_after: int | None = None  # send this many parts, then go silent
    drop_after: int | None = None  # send this many parts, then close the socket mid-body


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: Mapping[str, str]
    body: JSON


def json_reply(status: int, payload: JSON, headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, (json.dumps(payload).encode(),), headers or {}, stream=False)


def openai_sse(chunks: Iterable[JSON], done: bool = True) -> tuple[bytes, ...]:
    parts = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks]
    return (*parts, b"data: [DONE]\n\n") if done else tuple(parts)


def anthropic_sse(events: Iterable[JSON]) -> tuple[bytes, ...]:
    return tuple(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


# --- OpenAI chat completion chunks ---------------------------------------------------

OAI_MODEL = "gpt-4o-mini-2024-07-18"


def oai_chunk(delta: JSON, finish: str | None = None) -> JSON:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": OAI_MODEL,
        "system_fingerprint": "fp_1",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": None,
    }


def oai_usage(prompt: int, completion: int) -> JSON:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": OAI_MODEL,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def oai_text(*pieces: str) -> list[JSON]:
    return [
        oai_chunk({"role": "assistant", "content": ""}),
        *(oai_chunk({"content": p}) for p in pieces),
        oai_chunk({}, "stop"),
        oai_usage(11, 7),
    ]


def oai_error(message: str, kind: str, code: str | None = None) -> JSON:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# --- Anthropic message events --------------------------------------------------------

ANT_MODEL = "claude-sonnet-4-5-20250929"


def ant_start(input_tokens: int = 25, cache_read: int = 0) -> JSON:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": ANT_MODEL,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cache_read,
                "output_tokens": 1,
            },
        },
    }


def ant_block_start(index: int, block: JSON) -> JSON:
    return {"type": "content_block_start", "index": index, "content_block": block}


def ant_delta(index: int, delta: JSON) -> JSON:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def ant_block_stop(index: int) -> JSON:
    return {"type": "content_block_stop", "index": index}


def ant_end(stop_reason: str, output_tokens: int) -> list[JSON]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


def ant_text(*pieces: str) -> list[JSON]:
    return [
        ant_start(),
        ant_block_start(0, {"type": "text", "text": ""}),
        {"type": "ping"},
        *(ant_delta(0, {"type": "text_delta", "text": p}) for p in pieces),
        ant_block_stop(0),
        *ant_end("end_turn", 15),
    ]


def ant_error(kind: str, message: str) -> JSON:
    return {"type": "error", "error": {"type": kind, "message": message}}


# --- the server ----------------------------------------------------------------------

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
    529: "Overloaded",
}


@dataclass
class WireServer:
    """Serves `replies` in order (a request beyond them gets a 500 saying so)."""

    replies: list[Reply]
    requests: list[Recorded] = field(default_factory=list)
    port: int = 0  # 0: any free port
    on_request: Callable[[Recorded], None] | None = None  # told of each request as it is recorded
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[object]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aenter__(self) -> WireServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        line, *header_lines = head.split("\r\n")
        method, path, _ = line.split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append(Recorded(method, path, headers, json.loads(raw) if raw else {}))
        if self.on_request is not None:
            self.on_request(self.requests[-1])
        index = len(self.requests) - 1
        reply = (
            self.replies[index] if index < len(self.replies) else json_reply(500, {"error": "no reply left"})
        )
        start = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}", "Connection: close"]
        content_type = "text/event-stream" if reply.stream else "application/json"
        start += [f"Content-Type: {content_type}", *(f"{k}: {v}" for k, v in reply.headers.items())]
        if not reply.stream:
            body = b"".join(reply.body)
            writer.write(("\r\n".join([*start, f"Content-Length: {len(body)}"]) + "\r\n\r\n").encode() + body)
            await writer.drain()
            return
        writer.write(("\r\n".join([*start, "Transfer-Encoding: chunked"]) + "\r\n\r\n").encode())
        for sent, part in enumerate(reply.body):
            if sent == reply.drop_after:
                writer.transport.abort()  # mid-body: the chunked encoding is left unfinished
                return
            if sent == reply.stall_after:
                await asyncio.sleep(3600)
            writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()


# --- a stand-in endpoint, for trying the processor by hand ---------------------------

STAND_IN_TURNS: Final = 1000  # text turns served after the failures: more than a session needs


def stand_in_replies(api: str, text: str, failures: Sequence[int]) -> list[Reply]:
    """An error reply per status in `failures`, then the same text turn for every request."""
    words = text.split(" ")
    pieces = [w + " " for w in words[:-1]] + words[-1:]
    errors = [
        json_reply(status, oai_error(f"stand-in failure {status}",
                                     "server_error" if status >= 500 else "invalid_request_error"))
        if api == "openai"
        else json_reply(status, ant_error("api_error" if status >= 500 else "authentication_error",
                                          f"stand-in failure {status}"))
        for status in failures
    ]
    body = openai_sse(oai_text(*pieces)) if api == "openai" else anthropic_sse(ant_text(*pieces))
    return [*errors, *([Reply(body=body)] * STAND_IN_TURNS)]


def _print_request(recorded: Recorded) -> None:
    model, messages = recorded.body.get("model"), len(recorded.body.get("messages", []))
    # Whether a key came, never the key: Torpor sends "no-key" when none is configured.
    sent = recorded.headers.get("authorization") or recorded.headers.get("x-api-key") or ""
    key = "none" if not sent else "no-key" if sent.endswith("no-key") else "set"
    print(f"{recorded.method} {recorded.path} model={model} messages={messages} key={key}", flush=True)


async def _stand_in(server: WireServer) -> None:
    async with server:
        print(f"serving at {server.url}", flush=True)
        await asyncio.Event().wait()  # until interrupted


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.processors.providers.wire",
                                     description="A stand-in OpenAI or Anthropic endpoint.")
    parser.add_argument("api", choices=["openai", "anthropic"])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--fail", type=int, action="append", default=[], metavar="STATUS",
                        help="answer the next request with this HTTP status first (repeatable)")
    parser.add_argument("--text", default="Hello from the stand-in model.")
    args = parser.parse_args(argv)
    server = WireServer(stand_in_replies(args.api, args.text, args.fail), port=args.port,
                        on_request=_print_request)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_stand_in(server))


if __name__ == "__main__":
    main()
