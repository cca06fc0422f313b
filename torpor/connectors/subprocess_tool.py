"""`run_command`: run a command, stream its output while it runs, end with its exit code.

Arguments `{"command": str | [str, ...], "timeout_s": number, "cwd": str}`. A string runs
through `/bin/sh -c` (pipes, redirections); a list is executed as is. The call is a
subscription: the `ToolResult` (`subscription=true`) says the command started (its
pid), then associative `ToolEvent`s carry its stdout and stderr lines (`[stdout] ...`,
`[stderr] ...`) and the `final` event carries the exit code. Lines are batched (per
`FLUSH_S` or `MAX_BATCH_LINES`) because every associative event wakes the model; output
beyond `MAX_OUTPUT_BYTES` is dropped and the final event says how much.

The command runs in its own process group (a new session), so `cancel`, `close_thread`
and a timeout kill the whole group, children of children included: SIGTERM, then
SIGKILL after `KILL_GRACE_S`. A command that cannot start (no such file, bad cwd) is
one error result. After a connector restart an unfinished command is not run again
(`reconcile`: an error result and a final event): at most once, because a command's
effect cannot be looked up. Before acting, the dispatch's capability is checked (`capability.check`);
a refusal is an error result naming the reason. Event ids derive from the request id
and the sequence, so a resent event is a duplicate to the fold.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Final

from torpor.connectors.builtin import (
    BadArguments,
    BuiltinTool,
    arguments_object,
    builtin_spec,
    timeout_argument,
)
from torpor.connectors.inprocess import Clock, InputSink, text
from torpor.schemas.records import Dispatch, ToolEvent

DEFAULT_TIMEOUT_S: Final = 60.0
MAX_TIMEOUT_S: Final = 3600.0
KILL_GRACE_S: Final = 2.0
FLUSH_S: Final = 0.1
EXIT_POLL_S: Final = 0.01
LAST_SEQUENCE: Final = 2**62  # past any real event's number (the field is an Avro long)
MAX_BATCH_LINES: Final = 64
MAX_OUTPUT_BYTES: Final = 256 * 1024
MAX_LINE_BYTES: Final = 8 * 1024
READ_LIMIT: Final = 2**16  # asyncio's default StreamReader limit

RUN_COMMAND_SPEC: Final = builtin_spec(
    "run_command",
    (
        "Run a shell command (a string, through /bin/sh -c) or an argv list, with a timeout. "
        "Its output arrives as events while it runs; the last event has the exit code."
    ),
    {
        "type": "object",
        "properties": {
            "command": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1},
                ]
            },
            "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_S},
            "cwd": {"type": "string"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
)


def parse_command(arguments: str) -> tuple[list[str], float, str | None]:
    """(argv, timeout_s, cwd) from the call's JSON arguments."""
    args = arguments_object(arguments)
    command = args.get("command")
    if isinstance(command, str) and command.strip():
        argv = ["/bin/sh", "-c", command]
    elif isinstance(command, list) and command and all(isinstance(part, str) for part in command):
        argv = list(command)
    else:
        raise BadArguments("command must be a non-empty string or a non-empty list of strings")
    timeout = timeout_argument(args, DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S)
    cwd = args.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise BadArguments("cwd must be a string")
    return argv, timeout, cwd


def kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def exited(process: asyncio.subprocess.Process, timeout: float) -> bool:
    """Whether the process exited within `timeout` seconds.

    Not `process.wait()`: in asyncio that also waits for its pipes to close, which a
    background grandchild holding them delays until the grandchild ends; the exit code
    is known (`returncode`) as soon as the process is reaped.
    """
    end = asyncio.get_running_loop().time() + timeout
    while process.returncode is None:
        if asyncio.get_running_loop().time() >= end:
            return False
        await asyncio.sleep(EXIT_POLL_S)
    return True


class SubprocessTool(BuiltinTool):
    name = "subprocess"
    specs = (RUN_COMMAND_SPEC,)

    def __init__(self, sink: InputSink, clock: Clock) -> None:
        super().__init__(sink, clock)
        self._groups: dict[tuple[str, str], int] = {}  # (thread, call) -> process group id

    def invoke(self, dispatch: Dispatch) -> None:
        if self.answer_if_refused(dispatch):
            return
        try:
            argv, timeout, cwd = parse_command(dispatch.arguments)
        except BadArguments as error:
            self.answer(dispatch, ok=False, content=text(f"run_command: {error}"))
            return
        self.start(dispatch, self._run(dispatch, argv, timeout, cwd))

    def reconcile(self, dispatch: Dispatch) -> bool:
        """A command started by a process that died is never run again: it may have acted.

        Its process group died with that process or lives on unobserved; either way the
        output is lost. The call is answered with an error (a duplicate, absorbed by the
        fold, if the `started` result was already sent) and its subscription, if open,
        is ended with a final event numbered past any the dead process could have sent.
        """
        why = text("run_command was interrupted by a connector restart: the command may have run, "
                   "fully or in part; it is not run again")
        self.answer(dispatch, ok=False, content=why)
        body = ToolEvent(call_id=dispatch.call_id, request_id=dispatch.request_id, sequence=LAST_SEQUENCE,
                         associative=True, final=True, content=why)
        self.produce(dispatch.thread_id, dispatch.request_id, body, "event", "restart")
        return True

    def cancel(self, thread_id: str, call_id: str) -> None:
        # Kill first: cancelling the task alone would leave the process group running.
        pgid = self._groups.pop((thread_id, call_id), None)
        if pgid is not None:
            kill_group(pgid, signal.SIGKILL)
        super().cancel(thread_id, call_id)

    async def close(self) -> None:
        for pgid in self._groups.values():
            kill_group(pgid, signal.SIGKILL)
        self._groups.clear()
        await super().close()

    async def _run(self, dispatch: Dispatch, argv: list[str], timeout: float, cwd: str | None) -> None:
        key = (dispatch.thread_id, dispatch.call_id)
        spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
            *argv, cwd=cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
        ))
        try:
            # Shielded: the child runs (and may have started children) before its pipes are
            # connected, and a cancel then would make asyncio kill the child alone.
            process = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                child = await spawn
                kill_group(child.pid, signal.SIGKILL)
                await exited(child, KILL_GRACE_S)
            raise
        except OSError as error:
            self.answer(dispatch, ok=False, content=text(f"run_command could not start {argv[0]!r}: {error}"))
            return
        # With start_new_session the child leads its own group: its pgid is its pid.
        self._groups[key] = process.pid
        started = text(f"started pid {process.pid}: {argv!r}")
        self.answer(dispatch, ok=True, content=started, subscription=True)
        stream = _Stream(self, dispatch)
        assert process.stdout is not None and process.stderr is not None
        readers = [
            asyncio.ensure_future(stream.pump(process.stdout, "stdout")),
            asyncio.ensure_future(stream.pump(process.stderr, "stderr")),
        ]
        flusher = asyncio.ensure_future(stream.flush_every(FLUSH_S))
        try:
            timed_out = not await exited(process, timeout)
            if timed_out:
                kill_group(process.pid, signal.SIGTERM)
                if not await exited(process, KILL_GRACE_S):
                    kill_group(process.pid, signal.SIGKILL)
                    await exited(process, KILL_GRACE_S)
            # A background grandchild may still hold the pipes open: the group goes too.
            kill_group(process.pid, signal.SIGKILL)
            await asyncio.gather(*readers)
            code = process.returncode
            if timed_out:
                summary = f"timed out after {timeout:g} s: process group killed (exit code {code})"
            else:
                summary = f"exit code {code}"
            flusher.cancel()
            stream.finish(summary)
        finally:
            # Cancelled (or failed): nothing of this call may keep running or keep sending.
            kill_group(process.pid, signal.SIGKILL)
            flusher.cancel()
            for reader in readers:
                reader.cancel()
            self._groups.pop(key, None)
            await exited(process, KILL_GRACE_S)


class _Stream:
    """Batches one command's output lines into numbered associative events."""

    def __init__(self, tool: SubprocessTool, dispatch: Dispatch) -> None:
        self._tool = tool
        self._dispatch = dispatch
        self._lines: list[str] = []
        self._sequence = 0
        self._kept = 0
        self._dropped = 0

    async def pump(self, reader: asyncio.StreamReader, label: str) -> None:
        while True:
            try:
                raw = await reader.readline()
            except ValueError:  # a line beyond the reader's buffer limit: asyncio discarded it
                raw = f"(a line longer than {READ_LIMIT} bytes was dropped)\n".encode()
            if not raw:
                return
            if self._kept + len(raw) > MAX_OUTPUT_BYTES:
                self._dropped += len(raw)
                continue
            self._kept += len(raw)
            line = raw[:MAX_LINE_BYTES].decode("utf-8", errors="replace").rstrip("\n")
            self._lines.append(f"[{label}] {line}")
            if len(self._lines) >= MAX_BATCH_LINES:
                self.flush()

    async def flush_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            self.flush()

    def flush(self, final: bool = False, tail: str | None = None) -> None:
        if not self._lines and not final:
            return
        lines = [*self._lines, *([tail] if tail is not None else [])]
        self._lines = []
        body = ToolEvent(
            call_id=self._dispatch.call_id,
            request_id=self._dispatch.request_id,
            sequence=self._sequence,
            associative=True,
            final=final,
            content=text("\n".join(lines)),
        )
        where = self._dispatch
        self._tool.produce(where.thread_id, where.request_id, body, "event", str(self._sequence))
        self._sequence += 1

    def finish(self, summary: str) -> None:
        if self._dropped:
            summary += f"; {self._dropped} bytes of output dropped beyond {MAX_OUTPUT_BYTES}"
        self.flush(final=True, tail=summary)
