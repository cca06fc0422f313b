"""Bedrock's ConverseStream wire format, for `wire.WireServer` to serve to the real boto3 client.

A ConverseStream answer is an HTTP 200 whose body is a sequence of
`application/vnd.amazon.eventstream` messages. Each message is::

    prelude   total length (4 bytes), headers length (4), CRC32 of those 8 bytes (4)
    headers   per header: name length (1), name, value type (1; 7 = string),
              value length (2), value
    payload   JSON
    trailer   CRC32 of everything before it (4)

An event has the headers `:event-type` (the stream member: `messageStart`,
`contentBlockDelta`, ...), `:content-type: application/json` and `:message-type: event`;
an exception inside the stream has `:message-type: exception` and `:exception-type`
(`throttlingException`, `modelStreamErrorException`, ...) instead. `frame` encodes one;
the `cv_*` builders make the payloads in the shapes Bedrock sends, and each frame is
written as one HTTP chunk, so `drop_after` and `stall_after` cut the stream between events.

An error before the stream is plain JSON with the `x-amzn-ErrorType` header naming the
exception (`error_reply`), which is what botocore reads the error code from.

boto3 is pointed at the server with `endpoint_url`, dummy credentials (`CREDENTIALS`,
set by `client_environment`) and region `us-east-1`; it signs its requests, and the
server records them like any other.

The one departure from Bedrock: `WireServer` labels every streamed reply
`text/event-stream`, not `application/vnd.amazon.eventstream` (botocore decodes the body
by the operation's shape and never reads the label).

Run as a program, it is a stand-in Bedrock endpoint for trying `torpor processor` by hand:
`python -m tests.processors.providers.bedrock_wire --port 8768 --fail 429` answers the
first request with a ThrottlingException, then every request with a short streamed text
turn, and prints one line per request it received.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import pytest

from tests.processors.providers import wire

REGION: Final = "us-east-1"
MODEL: Final = "anthropic.claude-sonnet-4-5-20250929-v1:0"
CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
EVENTSTREAM: Final = "application/vnd.amazon.eventstream"
_STRING: Final = 7


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return (
        bytes([len(raw_name)]) + raw_name + bytes([_STRING]) + struct.pack(">H", len(raw_value)) + raw_value
    )


def frame(headers: Mapping[str, str], payload: wire.JSON) -> bytes:
    """One eventstream message (module docstring), CRCs included."""
    encoded = b"".join(_header(k, v) for k, v in headers.items())
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 12 + len(encoded) + len(body) + 4, len(encoded))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + body
    return message + struct.pack(">I", zlib.crc32(message))


def event(kind: str, payload: wire.JSON) -> bytes:
    return frame(
        {":event-type": kind, ":content-type": "application/json", ":message-type": "event"}, payload
    )


def exception(kind: str, message: str) -> bytes:
    headers = {":exception-type": kind, ":content-type": "application/json", ":message-type": "exception"}
    return frame(headers, {"message": message})


def stream(frames: Iterable[bytes], **reply: Any) -> wire.Reply:
    """A streamed 200 of `frames`, one chunk each (`reply`: `stall_after`, `drop_after`)."""
    return wire.Reply(body=tuple(frames), headers={"x-amzn-RequestId": "req-bedrock-1"}, **reply)


def error_reply(status: int, kind: str, message: str) -> wire.Reply:
    """An error before the stream: JSON body, the exception named by `x-amzn-ErrorType`."""
    # Bedrock appends a namespace after a colon; botocore keeps what precedes it.
    header = {"x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"}
    return wire.json_reply(status, {"message": message}, header)


# --- ConverseStream events -----------------------------------------------------------


def cv_start() -> bytes:
    return event("messageStart", {"role": "assistant"})


def cv_tool_start(index: int, call_id: str, name: str) -> bytes:
    payload = {"contentBlockIndex": index, "start": {"toolUse": {"toolUseId": call_id, "name": name}}}
    return event("contentBlockStart", payload)


def cv_delta(index: int, delta: wire.JSON) -> bytes:
    return event("contentBlockDelta", {"contentBlockIndex": index, "delta": delta})


def cv_stop(index: int) -> bytes:
    return event("contentBlockStop", {"contentBlockIndex": index})


def cv_end(
    stop_reason: str, input_tokens: int = 25, output_tokens: int = 15, cache_read: int = 0
) -> list[bytes]:
    usage = {
        "inputTokens": input_tokens,
        "outputTokens": output_tokens,
        "totalTokens": input_tokens + output_tokens + cache_read,
        "cacheReadInputTokens": cache_read,
    }
    return [
        event("messageStop", {"stopReason": stop_reason}),
        event("metadata", {"usage": usage, "metrics": {"latencyMs": 120}}),
    ]


def cv_text(*pieces: str) -> list[bytes]:
    return [cv_start(), *(cv_delta(0, {"text": p}) for p in pieces), cv_stop(0), *cv_end("end_turn")]


def cv_tool(index: int, call_id: str, *input_parts: str, name: str = "get_weather") -> list[bytes]:
    parts = (cv_delta(index, {"toolUse": {"input": p}}) for p in input_parts)
    return [cv_tool_start(index, call_id, name), *parts, cv_stop(index)]


# --- pointing boto3 at the server ----------------------------------------------------


def client_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy credentials for boto3's chain, and nothing else of a developer's AWS setup."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def decoded(frames: Iterable[bytes]) -> Iterator[tuple[dict[str, str], wire.JSON]]:
    """The headers and payload of each frame, read back by botocore's own decoder (a self-check)."""
    from botocore.eventstream import EventStreamBuffer

    buffer = EventStreamBuffer()
    for raw in frames:
        buffer.add_data(raw)
        for message in buffer:
            yield dict(message.headers), json.loads(message.payload)


# --- a stand-in endpoint, for trying the processor by hand ---------------------------

# What a failure status answers with: the exception Bedrock names for it.
_STAND_IN_ERRORS: Final = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}


def _print_request(recorded: wire.Recorded) -> None:
    # Whether the request was signed, never the signature.
    signed = recorded.headers.get("authorization", "").startswith("AWS4-HMAC-SHA256")
    messages = len(recorded.body.get("messages", []))
    print(f"{recorded.method} {recorded.path} messages={messages} signed={signed}", flush=True)


async def _stand_in(server: wire.WireServer) -> None:
    async with server:
        print(f"serving at {server.url}", flush=True)
        await asyncio.Event().wait()  # until interrupted


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.processors.providers.bedrock_wire", description="A stand-in Bedrock endpoint."
    )
    parser.add_argument("--port", type=int, default=8768)
    parser.add_argument(
        "--fail",
        type=int,
        action="append",
        default=[],
        choices=sorted(_STAND_IN_ERRORS),
        metavar="STATUS",
        help="answer the next request with this HTTP status first (repeatable)",
    )
    parser.add_argument("--text", default="Hello from the Bedrock stand-in.")
    args = parser.parse_args(argv)
    words = args.text.split(" ")
    turn = stream(cv_text(*[w + " " for w in words[:-1]], words[-1]))
    errors = [
        error_reply(status, _STAND_IN_ERRORS[status], f"stand-in failure {status}") for status in args.fail
    ]
    server = wire.WireServer(
        [*errors, *([turn] * wire.STAND_IN_TURNS)], port=args.port, on_request=_print_request
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_stand_in(server))


if __name__ == "__main__":
    main()
