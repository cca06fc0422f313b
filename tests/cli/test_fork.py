"""`torpor fork` against a real broker: a fork from an earlier entry, refusals, then a replay.

A thread talks twice; `torpor fork THREAD --at 0 --as NEW` (NEW on another partition, so
the processor's `CreateThread` crosses partitions) waits for both receipts, and the fork's
history is the source's first entry, then the model's answer to it; the source keeps its
four entries. Mistaken and hostile requests exit 1 with the receipt's reason, or 2 before
anything is produced. Then, the processor stopped, `torpor replay` re-folds the log, fork
included, and every thread's head matches the changelog's.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka.admin import AdminClient

from tests.cli.rig import deploy
from tests.processors.test_processor import PARTITIONS, TORPOR, Deployment
from tests.waiting import wait_until
from torpor.streams.partitioner import partition_for

pytestmark = pytest.mark.kafka

FIRST: Final = "The first answer."
SECOND: Final = "The second answer."
SCRIPT: Final = f"""\
[thread]
id = "unused"

[[model]]
last_contains = "hello"
turns = [{{ text = "{FIRST}" }}]

[[model]]
last_contains = "tell me more"
turns = [{{ text = "{SECOND}" }}]
"""


@pytest.fixture
def deployment(kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> Iterator[Deployment]:
    with deploy(kafka_bootstrap, admin, tmp_path, SCRIPT, "torpor.connectors.echo:EchoTool") as found:
        yield found


def _elsewhere(thread: str) -> str:
    """A new thread id on another partition than `thread`'s."""
    home = partition_for(thread.encode(), PARTITIONS)
    return next(f"{thread}-fork{n}" for n in count()
                if partition_for(f"{thread}-fork{n}".encode(), PARTITIONS) != home)


def _history(deployment: Deployment, thread: str) -> list[str]:
    done = deployment.run([TORPOR, "history", thread, "--from-changelog"])
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_fork_from_an_earlier_entry_answers_again_and_replays_exactly(deployment: Deployment) -> None:
    thread = f"talker-{uuid.uuid4().hex[:8]}"
    for text, extra in (("hello", ["--new", "--model", "scripted"]), ("tell me more", [])):
        sent = deployment.run([TORPOR, "send", thread, text, *extra, "--wait", "60"])
        assert sent.returncode == 0, sent.stdout + sent.stderr
    wait_until(lambda: deployment.answers(thread) == [FIRST, SECOND], timeout=120,
               message=lambda: f"two answers; processor log:\n{deployment.log('processor')[-3000:]}")

    fork = _elsewhere(thread)
    done = deployment.run([TORPOR, "fork", thread, "--at", "0", "--as", fork, "--operator", "ops",
                           "--wait", "60"])
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"sent fork of {thread} at 0 as {fork} (message ")
    assert [line.split()[2] for line in lines if line.startswith("receipt ")] == ["applied", "applied"], lines
    assert lines[-1] == f"forked {thread} at 0 as {fork}"
    wait_until(lambda: deployment.answers(fork) == [FIRST], timeout=120,
               message=lambda: f"the fork's answer; processor log:\n{deployment.log('processor')[-3000:]}")
    forked, source = _history(deployment, fork), _history(deployment, thread)
    assert len(forked) == 2 and len(source) == 4, (forked, source)
    assert forked[0] == source[0]  # seq, kind, the same hash head, the same content
    assert "hello" in forked[0] and FIRST in forked[1]
    assert deployment.answers(thread) == [FIRST, SECOND]

    # Mistakes and hostile requests: one receipt each, with its reason, and exit 1.
    for args, said in (([thread, "--at", "99", "--as", f"{fork}-x"], "rejected:fork_seq_out_of_range"),
                       ([thread, "--at", "0", "--as", fork], "rejected:thread_exists"),
                       ([f"nobody-{uuid.uuid4().hex[:8]}", "--at", "0"], "rejected:unknown_thread")):
        refused = deployment.run([TORPOR, "fork", *args, "--wait", "60"])
        assert refused.returncode == 1 and said in refused.stdout, (args, refused.stdout, refused.stderr)
        assert "not forked" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    for args, said in (([thread, "--at", "0", "--as", "has space"], "--as"),
                       ([thread, "--at", "-1"], "--at"), ([thread], "--at"),
                       ([thread, "--at", "0", "--as", thread], "new id")):
        usage = deployment.run([TORPOR, "fork", *args])
        assert usage.returncode == 2 and said in usage.stderr, (args, usage.stderr)

    processor = deployment.processes[0]
    processor.send_signal(signal.SIGTERM)
    assert processor.wait(timeout=60) == 0, deployment.log("processor")[-3000:]
    replay = deployment.run([TORPOR, "replay", "--no-progress"])
    assert replay.returncode == 0, replay.stdout + replay.stderr
    heads = {line.split()[0]: line for line in replay.stdout.splitlines()}
    assert {thread, fork} <= set(heads) and all(line.endswith("  ok") for line in heads.values()), heads
    assert ", 0 differ" in replay.stderr
