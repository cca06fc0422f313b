"""The rig shared by the processor tests with a real model client (`openai`, `anthropic`).

Each such test runs `torpor processor` and `torpor connector run-echo` as processes
against the real broker (`Deployment` of `test_processor`), with the processor's
provider base URL pointing at a `wire.WireServer` in the test process. The server runs
on an event loop of its own thread, because the test's thread blocks in `wait_until`
while the processor (another process) talks to it.

- `serving(replies)`: the wire server, started and stopped around a block;
- `start_agent(...)`: create a thread on a model, say one thing, start `torpor tail` on
  the thread, then the processor and the echo connector;
- `wait_for(deployment, condition, what)`: `wait_until`, and on timeout the processor's
  log as it is then (not as it was when the wait began);
- `stop_cleanly(...)`: SIGTERM, and each process must exit 0;
- `assert_one_receipt_each(deployment)`: every input record has exactly one receipt,
  whatever its disposition (a `parked` one included), and no input was produced twice;
- `streamed_turns(...)`: for each committed turn of a thread, the text its live `delta`
  events carried before the commit, beside the text the turn committed;
- `tailed_turns(...)`: the same pairs as the live `torpor tail THREAD` that `start_agent`
  started printed them: the text of the `model…` lines (the deltas, whitespace removed:
  `squashed`), and the committed turn's `model` line as rendered (thinking and calls
  shown beside the text).
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

from tests.processors.providers import wire
from tests.processors.test_processor import TORPOR, Deployment, _conversation
from tests.waiting import wait_until
from torpor.schemas.codec import decode_value
from torpor.schemas.records import AssistantEntry, CreateThread, TextBlock, ThreadEvent

# Starting and stopping the server is local; 10 s only bounds a broken loop.
SERVER_CALL_S: Final = 10.0
# A turn through the broker takes seconds; two minutes allows for a loaded 2-core machine.
TURN_TIMEOUT_S: Final = 120.0


@contextmanager
def serving(replies: list[wire.Reply]) -> Iterator[wire.WireServer]:
    """A wire server answering `replies` in order, on a loop in a daemon thread."""
    loop = asyncio.new_event_loop()
    server = wire.WireServer(replies)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(SERVER_CALL_S)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.__aexit__(), loop).result(SERVER_CALL_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(SERVER_CALL_S)
        loop.close()


def start_agent(
    deployment: Deployment, thread_id: str, model: str, text: str, *processor_flags: str
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """Send a CreateThread on `model` and a UserMessage `text`; start (processor, echo connector)."""
    create, hello = _conversation(thread_id, text)
    assert isinstance(create.body, CreateThread)
    body = dataclasses.replace(create.body, config=dataclasses.replace(create.body.config, model=model))
    deployment.send(dataclasses.replace(create, body=body), hello)
    # A person watching from before the first completion: `tailed_turns` reads what it printed.
    resume = deployment.root / f"tail-{thread_id}.json"
    deployment.start([TORPOR, "tail", thread_id, "--resume-file", str(resume)], f"tail-{thread_id}")
    processor = deployment.start(deployment.processor_args("p0", *processor_flags), "processor")
    echo = deployment.start([TORPOR, "connector", "run-echo", "--group", f"echo-{deployment.prefix}",
                             "--journal-dir", str(deployment.root / "journal")], "echo")
    return processor, echo


def wait_for(deployment: Deployment, condition: Callable[[], object], what: str) -> None:
    """Wait for `condition`; on timeout, fail with `what` and the processor's log tail."""
    try:
        wait_until(condition, timeout=TURN_TIMEOUT_S, message=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; processor log:\n{deployment.log('processor')[-3000:]}") from None


def stop_cleanly(deployment: Deployment, processor: subprocess.Popen[bytes],
                 echo: subprocess.Popen[bytes]) -> None:
    """SIGTERM both; each must exit 0 (a clean stop), or the assertion shows its log."""
    for process in (processor, echo):
        process.send_signal(signal.SIGTERM)
    assert processor.wait(timeout=60) == 0, deployment.log("processor")[-3000:]
    assert echo.wait(timeout=60) == 0, deployment.log("echo")[-3000:]


def assert_one_receipt_each(deployment: Deployment) -> None:
    """One receipt per input record, of any disposition; no message id produced twice."""
    inputs = Counter(i.message_id for i in deployment.inputs())
    assert all(n == 1 for n in inputs.values()), f"produced twice: {inputs}"
    receipts = Counter(r.input_id for r in deployment.receipts())
    assert receipts == inputs, (inputs, receipts)


def thread_events(deployment: Deployment, thread_id: str) -> list[ThreadEvent]:
    """The events of `thread_id` in offset order (a thread's events share one partition)."""
    events = (decode_value(v or b"", ThreadEvent) for _, v, _ in deployment.records("events"))
    return [e for e in events if e.thread_id == thread_id]


def streamed_turns(deployment: Deployment, thread_id: str) -> list[tuple[str, str]]:
    """(text of the live deltas since the previous turn, text the turn committed), per turn.

    Deltas come from the model stage while the model streams, outside any transaction;
    a turn is committed only after its Completion is folded. So every delta of a turn
    sits before that turn's `turn_committed` on the partition.
    """
    turns: list[tuple[str, str]] = []
    live: list[str] = []
    for event in thread_events(deployment, thread_id):
        if event.kind == "delta" and event.ephemeral:
            live.append(event.text or "")
        elif event.kind == "turn_committed" and event.entry is not None:
            body = event.entry.body
            if isinstance(body, AssistantEntry):
                said = "".join(b.text for b in body.content if isinstance(b, TextBlock))
                turns.append(("".join(live), said))
                live = []
    return turns


def tailed_turns(deployment: Deployment, thread_id: str) -> list[tuple[str, str]]:
    """(delta text, committed line) per turn, from what the live `torpor tail THREAD` printed.

    The tail `start_agent` started follows the thread from before its first completion;
    this waits until it has printed every turn the thread committed. A delta line shows
    its text with runs of whitespace collapsed, so the delta text is compared `squashed`.
    """

    def printed() -> list[tuple[str, str]] | None:
        turns: list[tuple[str, str]] = []
        live: list[str] = []
        for line in deployment.log(f"tail-{thread_id}").splitlines():
            # time, thread, kind, text: `torpor.cli.render` pads the columns with spaces.
            _, _, kind, text = [*line.split(None, 3), "", "", "", ""][:4]
            if kind == "model…":
                live.append(text)
            elif kind == "model":
                turns.append((squashed("".join(live)), text.partition(" ")[2]))  # after the "#<seq>"
                live = []
        return turns if len(turns) == len(deployment.answers(thread_id)) else None

    found: list[tuple[str, str]] = []
    wait_for(deployment, lambda: found.extend(printed() or []) or found, "torpor tail printed every turn")
    return found


def squashed(text: str) -> str:
    return "".join(text.split())
