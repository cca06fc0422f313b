"""`torpor send`, `torpor tail` and the observer API against a real broker and processor.

A processor (scripted model) and the echo connector run as processes. The conversation is
started with `torpor send --new` and continued turn by turn with `torpor send`. A first
`torpor tail` attaches mid-conversation, is stopped mid-turn, a turn passes with no tail
attached, and a second `torpor tail` with the same resume file picks up: what the two
printed, one after the other, must equal what one full read (`--no-follow`, a fresh
resume file) prints, line for line, with no gap and no repeat. The observer API is
checked the same way at a finer grain: a snapshot taken while a completion is streaming
holds the partial text, and what follows it holds the rest, once.
"""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka.admin import AdminClient

from tests.cli.rig import deploy, send, settings_of, start_thread, tailed
from tests.processors.test_processor import TORPOR, Deployment
from tests.waiting import wait_until
from torpor.schemas.records import AssistantEntry, TextBlock, ThreadEvent
from torpor.streams.deadline import Deadline
from torpor.streams.observer import Observed, Observer, Snapshot

pytestmark = pytest.mark.kafka

ANSWER: Final = "The echo answered."
TURNS: Final = 4  # a scripted rule's turns are used once each per thread, so each is repeated
SLOW_CHUNKS: Final = ("Thinking ", "it over ", "slowly, ", "then done.")
_PING: Final = '{ text = "Pinging.", calls = [{ name = "echo", arguments = { text = "ping" } }] }'
_SLOW: Final = "[" + ", ".join(f'"{c}"' for c in SLOW_CHUNKS) + "]"
_ANSWERED: Final = f'{{ text = "{ANSWER}" }}'
SCRIPT: Final = f"""\
[thread]
id = "unused"

[[model]]
last_contains = "echo: "
turns = [{", ".join([_ANSWERED] * TURNS)}]

[[model]]
last_contains = "ping slowly"
turns = [{{ chunks = {_SLOW}, delay_s = 4.0, calls = [{{ name = "echo", arguments = {{ text = "p" }} }}] }}]

[[model]]
last_contains = "please ping"
turns = [{", ".join([_PING] * TURNS)}]

[[model]]
last_contains = "take your time"
turns = [{{ chunks = {_SLOW}, delay_s = 4.0 }}]
"""


@pytest.fixture
def deployment(kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> Iterator[Deployment]:
    with deploy(kafka_bootstrap, admin, tmp_path, SCRIPT, "torpor.connectors.echo:EchoTool") as found:
        yield found


def answers(deployment: Deployment, thread: str) -> int:
    return sum(1 for text in deployment.answers(thread) if text == ANSWER)


def shown(out: Path) -> int:
    """Committed answers a tail printed (its live deltas carry the same text: not counted)."""
    return sum(1 for line in lines(out) if re.search(rf" model +#\d+ {re.escape(ANSWER)}$", line))


def tail(deployment: Deployment, thread: str, resume: Path, out: Path) -> subprocess.Popen[bytes]:
    with out.open("wb") as sink:
        process = subprocess.Popen([TORPOR, "tail", thread, "--receipts", "--resume-file", str(resume)],
                                   env=deployment.env, stdout=sink, stderr=subprocess.PIPE)
    deployment.processes.append(process)  # killed at teardown if the test fails before stopping it
    return process


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def by_topic(rendered: list[str]) -> tuple[list[str], list[str]]:
    """Events and receipts come from two topics, whose interleaving is not an order: compare each."""
    receipts = [line for line in rendered if " receipt " in line]
    return [line for line in rendered if " receipt " not in line], receipts


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    _, errors = process.communicate(timeout=30)
    assert process.returncode == 0, errors
    assert b"Exception ignored" not in errors and b"Traceback" not in errors, errors  # a clean stop


def test_a_reattached_tail_continues_without_gap_or_repeat(deployment: Deployment, tmp_path: Path) -> None:
    thread = f"agent-{uuid.uuid4().hex[:8]}"
    start_thread(deployment, thread, "please ping (turn 1)", "echo")
    wait_until(lambda: answers(deployment, thread) == 1, timeout=120,
               message=lambda: f"turn 1; processor log:\n{deployment.log('processor')[-3000:]}")

    resume, first_out, second_out = tmp_path / "resume.json", tmp_path / "first.txt", tmp_path / "second.txt"
    first = tail(deployment, thread, resume, first_out)
    wait_until(lambda: shown(first_out) == 1, timeout=60, message="the first tail shows turn 1")
    send(deployment, thread, "please ping (turn 2)")
    wait_until(lambda: shown(first_out) == 2, timeout=120, message="turn 2, live")
    send(deployment, thread, "please ping slowly (turn 3)")
    wait_until(lambda: re.search(rf" model… +{SLOW_CHUNKS[0].strip()}", first_out.read_text()), timeout=60,
               message="turn 3's completion streams, live")
    stop(first)  # mid-completion: the rest of its text, the echo and the answer are still to come
    assert shown(first_out) == 2

    wait_until(lambda: answers(deployment, thread) == 3, timeout=120, message="turn 3, with no tail attached")
    send(deployment, thread, "please ping (turn 4)")
    second = tail(deployment, thread, resume, second_out)
    wait_until(lambda: shown(second_out) == 2, timeout=120,
               message="the second tail shows the rest of turn 3, and turn 4")
    inputs = 1 + TURNS * 4  # the creation, then per turn: user text, completion, echo result, completion
    wait_until(lambda: len([i for i in deployment.inputs() if i.thread_id == thread]) == inputs,
               timeout=60, message=f"{inputs} inputs")
    wait_until(lambda: second_out.read_text().count(" receipt ") + first_out.read_text().count(" receipt ")
               == inputs, timeout=60, message="a receipt line per input")
    stop(second)

    full = tmp_path / "full.txt"
    with full.open("wb") as sink:
        done = subprocess.run([TORPOR, "tail", thread, "--receipts", "--no-follow", "--resume-file",
                               str(tmp_path / "fresh.json")], env=deployment.env, stdout=sink,
                              stderr=subprocess.PIPE, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert lines(first_out) and lines(second_out)
    assert by_topic(lines(first_out) + lines(second_out)) == by_topic(lines(full))
    events, receipts = by_topic(lines(full))
    assert len(receipts) == inputs
    assert shown(full) == TURNS
    assert any(" model… " in line for line in events), "live deltas are rendered"
    assert sum(" tool_dispatched " in line for line in events) == TURNS


def test_a_snapshot_mid_completion_holds_the_partial_text_and_follow_the_rest(deployment: Deployment) -> None:
    thread = f"agent-{uuid.uuid4().hex[:8]}"
    start_thread(deployment, thread, "please ping (turn 1)", "echo")
    wait_until(lambda: answers(deployment, thread) == 1, timeout=120,
               message=lambda: f"turn 1; processor log:\n{deployment.log('processor')[-3000:]}")
    send(deployment, thread, "take your time")
    with Observer(settings_of(deployment)) as observer:
        def streaming() -> Snapshot | None:
            taken = observer.snapshot(thread)
            return taken if taken.partial else None

        snapshot = wait_until(streaming, timeout=60, message="a snapshot while the slow completion streams")
        assert snapshot.complete, snapshot.missing
        assert snapshot.partial != "".join(SLOW_CHUNKS) and "".join(SLOW_CHUNKS).startswith(snapshot.partial)
        kinds = [type(e.body).__name__ for e in snapshot.entries]
        assert kinds[:4] == ["UserEntry", "AssistantEntry", "ToolResultEntry", "AssistantEntry"]
        assert [e.seq for e in snapshot.entries] == list(range(len(snapshot.entries)))

        rest = ""
        turn: AssistantEntry | None = None
        for item in observer.follow(snapshot.position, threads=[thread], deadline=Deadline.after(60)):
            assert isinstance(item, Observed)
            event = item.record
            assert isinstance(event, ThreadEvent)
            assert event.entry is None or event.entry.seq >= len(snapshot.entries), "no entry twice"
            if event.kind == "delta":
                rest += event.text or ""
            elif event.kind == "turn_committed" and event.entry is not None:
                assert isinstance(event.entry.body, AssistantEntry)
                turn = event.entry.body
                break
        assert turn is not None
        assert snapshot.partial + rest == "".join(SLOW_CHUNKS)
        assert "".join(b.text for b in turn.content if isinstance(b, TextBlock)) == "".join(SLOW_CHUNKS)


def _ms_of_day(line: str) -> int:
    hours, minutes, seconds = line[:12].split(":")
    return (int(hours) * 3600 + int(minutes) * 60) * 1000 + round(float(seconds) * 1000)


def test_a_no_follow_tail_interleaves_events_and_receipts_in_time_order(
    deployment: Deployment, tmp_path: Path
) -> None:
    thread = f"agent-{uuid.uuid4().hex[:8]}"
    start_thread(deployment, thread, "please ping (turn 1)", "echo")
    inputs = 5  # the creation, the user's text, a completion, the echo's result, a completion
    wait_until(lambda: answers(deployment, thread) == 1, timeout=120,
               message=lambda: f"turn 1; processor log:\n{deployment.log('processor')[-3000:]}")
    wait_until(lambda: tailed(deployment, thread, tmp_path).count(" receipt ") == inputs, timeout=60,
               message="a receipt per input")
    shown = tailed(deployment, thread, tmp_path).splitlines()
    times = [_ms_of_day(line) for line in shown]
    day = 24 * 3600 * 1000
    # Never backwards (a tail that runs over midnight UTC wraps once).
    assert all((b - a) % day < day // 2 for a, b in itertools.pairwise(times)), shown
    receipts = [i for i, line in enumerate(shown) if " receipt " in line]
    events = [i for i, line in enumerate(shown) if " receipt " not in line]
    assert receipts[0] < events[-1], "receipts are interleaved with the events, not all after them"
