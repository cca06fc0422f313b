"""`torpor control` against a real broker: a thread parked on a bad model is switched and unparked.

A thread created with a model string no provider serves parks on its first completion
(an error Completion, loudly). `torpor control THREAD set_model --model scripted` switches
it, `torpor control THREAD unpark` asks the model again, and the scripted model answers:
all of it visible in `torpor tail`. After `stop`, `torpor send --wait` reports the
`stopped` receipt and exits 1. Flags that do not go together are refused before anything
is produced.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka.admin import AdminClient

from tests.cli.rig import answer, deploy, script, tailed
from tests.processors.test_processor import TORPOR, Deployment
from tests.waiting import wait_until

pytestmark = pytest.mark.kafka

ANSWER: Final = "Hello from the right model."
SCRIPT: Final = script(answer("hello", ANSWER))


@pytest.fixture
def deployment(kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> Iterator[Deployment]:
    with deploy(kafka_bootstrap, admin, tmp_path, SCRIPT, "torpor.connectors.echo:EchoTool") as found:
        yield found


def control(deployment: Deployment, *args: str) -> str:
    done = deployment.run([TORPOR, "control", *args])
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_thread_parked_on_a_bad_model_is_switched_and_unparked(deployment: Deployment,
                                                                 tmp_path: Path) -> None:
    thread = f"agent-{uuid.uuid4().hex[:8]}"
    sent = deployment.run([TORPOR, "send", thread, "hello", "--new", "--model", "nowhere:model",
                           "--wait", "60"])
    assert sent.returncode == 0, sent.stderr
    assert [line.split()[2] for line in sent.stdout.splitlines() if line.startswith("receipt ")] == \
        ["applied", "applied"], sent.stdout
    wait_until(lambda: " parked " in tailed(deployment, thread, tmp_path), timeout=120,
               message=lambda: f"the thread parks; processor log:\n{deployment.log('processor')[-3000:]}")

    said = control(deployment, thread, "set_model", "--model", "scripted")
    assert said.startswith(f"sent set_model to {thread}")
    control(deployment, thread, "unpark", "--reason", "model fixed")

    def answered() -> str | None:
        text = tailed(deployment, thread, tmp_path)
        return text if ANSWER in text else None

    text = wait_until(answered, timeout=120, message="the answer after the switch")
    assert "model_set " in text and "model=scripted" in text
    assert " unparked " in text

    control(deployment, thread, "stop", "--reason", "done")
    late = deployment.run([TORPOR, "send", thread, "hello again", "--wait", "60"])
    assert late.returncode == 1, late
    assert " stopped (done)" in late.stdout and "not applied" in late.stderr, late


def test_flags_that_do_not_go_together_are_refused(deployment: Deployment) -> None:
    for args, said in ((["t", "set_model"], "set_model needs it"), (["t", "stop", "--model", "m"], "--model"),
                       (["t", "cancel_call"], "cancel_call needs it"),
                       (["t", "stop", "--signing-key-id", "k"], "both --signing-key-id")):
        done = deployment.run([TORPOR, "control", *args])
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)


def test_a_command_to_a_thread_that_does_not_exist_says_so_and_exits_1(deployment: Deployment) -> None:
    """`control` waits for its receipt by default: `sent` alone would claim a success."""
    nobody = f"nobody-{uuid.uuid4().hex[:8]}"
    done = deployment.run([TORPOR, "control", nobody, "stop"])
    assert done.returncode == 1, done
    assert f"sent stop to {nobody}" in done.stdout and " rejected:unknown_thread" in done.stdout, done.stdout
    assert "not applied" in done.stderr, done.stderr


def test_a_negative_wait_is_refused_before_anything_is_produced(deployment: Deployment) -> None:
    thread = f"never-{uuid.uuid4().hex[:8]}"
    for command in (["send", thread, "hello", "--wait", "-5"], ["control", thread, "stop", "--wait", "-5"]):
        done = deployment.run([TORPOR, *command])
        assert done.returncode == 2 and "--wait" in done.stderr and "Traceback" not in done.stderr, done
    assert not [i for i in deployment.inputs() if i.thread_id == thread]
