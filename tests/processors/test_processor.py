"""The Kafka processor end to end: `torpor processor` and `torpor connector run-echo` as processes.

One agent turn through the real broker: CreateThread and UserMessage on `inputs`, the
processor folds them and requests a completion, the scripted model (in the processor's
model stage) calls `echo`, the dispatch reaches the echo connector through the outbox,
its ToolResult comes back on `inputs`, and the model's final answer is committed. Then,
from the outside and read_committed: every input has exactly one receipt, and the
outbox holds no request id twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from tests.streams.counter_rig import read_committed
from tests.waiting import wait_until
from torpor.connectors.echo import ECHO_SPEC
from torpor.schemas.codec import decode_value, encode_value
from torpor.schemas.records import (
    AssistantEntry,
    Budgets,
    Capability,
    CreateThread,
    Dispatch,
    Input,
    InputBody,
    Receipt,
    TextBlock,
    ThreadConfig,
    ThreadEvent,
    UserMessage,
)
from torpor.streams.admin import ensure_topics
from torpor.streams.config import KafkaSettings, Settings, TopicSettings
from torpor.streams.deadline import Deadline
from torpor.streams.partitioner import partition_for
from torpor.streams.topics import TopicNames

pytestmark = pytest.mark.kafka

REPO: Final = Path(__file__).resolve().parents[2]
PARTITIONS: Final = 3
# The console command as installed beside this interpreter (the venv's `torpor`).
TORPOR: Final = str(Path(sys.executable).with_name("torpor"))

SCRIPT: Final = """\
[thread]
id = "unused"

[[model]]
last_contains = "echo: ping"
turns = [{ text = "The echo said ping." }]

[[model]]
last_contains = "ping"
turns = [{ text = "Pinging.", calls = [{ name = "echo", arguments = { text = "ping" } }] }]

[[model]]
last_contains = "slowly"
turns = [{ text = "Pinging.", delay_s = 2.0, calls = [{ name = "echo", arguments = { text = "ping" } }] }]

[[model]]
last_contains = "hello"
turns = [{ text = "Hello to you." }]
"""


@dataclass
class Deployment:
    """One test's topics (a prefix of its own), stores and processes."""

    bootstrap: str
    root: Path
    prefix: str = field(default_factory=lambda: f"test.proc.{uuid.uuid4().hex[:10]}.")
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "TORPOR_BOOTSTRAP": self.bootstrap, "TORPOR_TOPIC_PREFIX": self.prefix,
                "TORPOR_PARTITIONS": str(PARTITIONS)}

    def topic(self, suffix: str) -> str:
        return f"{self.prefix}{suffix}"

    def processor_args(self, instance: str = "p0", *extra: str) -> list[str]:
        script = self.root / "script.toml"
        script.write_text(SCRIPT)
        return [TORPOR, "processor", "--instance", instance, "--app",
                f"app-{self.prefix}", "--store-dir", str(self.root / f"stores-{instance}"),
                "--script", str(script), *extra]

    def start(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115
        process = subprocess.Popen(args, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def run(self, args: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=REPO, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)

    def send(self, *records: Input) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "partitioner": "murmur2_random"})
        for record in records:
            producer.produce(self.topic("inputs"), key=record.thread_id.encode(), value=encode_value(record))
        assert producer.flush(30) == 0

    def send_raw(self, key: bytes, value: bytes, partition: int | None = None) -> None:
        """`value` under `key`, on `partition` if given (else the key's own, by murmur2)."""
        producer = Producer({"bootstrap.servers": self.bootstrap, "partitioner": "murmur2_random"})
        if partition is None:
            producer.produce(self.topic("inputs"), key=key, value=value)
        else:
            producer.produce(self.topic("inputs"), key=key, value=value, partition=partition)
        assert producer.flush(30) == 0

    def records(self, suffix: str) -> list[tuple[bytes | None, bytes | None, int]]:
        return read_committed(self.bootstrap, self.topic(suffix))

    def receipts(self) -> list[Receipt]:
        return [decode_value(v or b"", Receipt) for _, v, _ in self.records("receipts")]

    def inputs(self) -> list[Input]:
        found: list[Input] = []
        for _, value, _ in self.records("inputs"):
            try:
                found.append(decode_value(value or b"", Input))
            except Exception:
                continue  # the poison record of a test
        return found

    def dispatches(self) -> list[Dispatch]:
        return [decode_value(v or b"", Dispatch) for _, v, _ in self.records("outbox")]

    def answers(self, thread_id: str) -> list[str]:
        """The text of every committed model turn of `thread_id`, in order."""
        texts: list[str] = []
        for _, value, _ in self.records("events"):
            event = decode_value(value or b"", ThreadEvent)
            if event.thread_id == thread_id and event.kind == "turn_committed" and event.entry is not None:
                body = event.entry.body
                if isinstance(body, AssistantEntry):
                    texts.append(" ".join(b.text for b in body.content if isinstance(b, TextBlock)))
        return texts


class Tail:
    """A read_committed reader of one topic that keeps its place, for cheap progress checks."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"tail-{uuid.uuid4().hex}",
                                   "isolation.level": "read_committed", "enable.auto.commit": False,
                                   "auto.offset.reset": "earliest"})
        self._consumer.subscribe([topic])
        self.values: list[bytes] = []

    def _drain(self) -> None:
        for message in self._consumer.consume(1000, timeout=0.2):
            if message.error() is None:
                self.values.append(message.value() or b"")

    def count(self) -> int:
        self._drain()
        return len(self.values)

    def answers(self) -> list[tuple[str, str]]:
        """(thread id, text) of every committed model turn seen so far."""
        self._drain()
        found: list[tuple[str, str]] = []
        for value in self.values:
            event = decode_value(value, ThreadEvent)
            if event.kind == "turn_committed" and event.entry is not None:
                body = event.entry.body
                if isinstance(body, AssistantEntry):
                    found.append((event.thread_id, " ".join(b.text for b in body.content
                                                            if isinstance(b, TextBlock))))
        return found


@pytest.fixture
def deployment(kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> Iterator[Deployment]:
    found = Deployment(kafka_bootstrap, tmp_path)
    # Created before the first input is sent: a broker that auto-creates topics would
    # otherwise make `inputs` with one partition.
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
                        topics=TopicSettings(prefix=found.prefix, partitions=PARTITIONS))
    ensure_topics(admin, settings, Deadline.after(60))
    yield found
    found.stop_all()
    names = TopicNames.for_prefix(found.prefix).all()
    for future in admin.delete_topics(list(names), operation_timeout=30).values():
        future.result(timeout=60)


def _config() -> ThreadConfig:
    return ThreadConfig(
        model="scripted", system_prompt="You are a test agent.", tools=(ECHO_SPEC,),
        capability=Capability(tenant="test", tools=("echo",), scopes=("test",), expires_at=None),
        budgets=Budgets(max_turns=None, max_children=None, max_tool_retries=2, max_invalid_calls=3),
        parent=None, context_window=200_000, compaction_threshold=0.8, allow_implicit_create=False,
    )


def _input(thread_id: str, message_id: str, created_at: int, body: InputBody) -> Input:
    return Input(message_id=message_id, thread_id=thread_id, created_at=created_at, source="user:test",
                 expires_at=None, key_id=None, signature=None, body=body)


def _conversation(thread_id: str, text: str) -> tuple[Input, Input]:
    return (
        _input(thread_id, f"{thread_id}-create", 1_000, CreateThread(_config(), (), ())),
        _input(thread_id, f"{thread_id}-hello", 2_000, UserMessage((TextBlock(text),))),
    )


def _assert_one_receipt_per_input(deployment: Deployment) -> None:
    inputs = Counter(i.message_id for i in deployment.inputs())
    receipts = Counter(r.input_id for r in deployment.receipts() if r.disposition != "parked")
    assert receipts == Counter(set(inputs)), (inputs, receipts)
    copies = {m: n for m, n in inputs.items() if n > 1}
    # A re-produced input (a completion re-issued, a redelivered tool result) has a
    # `duplicate` receipt of its own; here nothing was re-produced.
    assert not copies, copies


def test_one_agent_turn_runs_end_to_end_through_kafka(deployment: Deployment) -> None:
    thread_id = f"agent-{uuid.uuid4().hex[:8]}"
    deployment.send(*_conversation(thread_id, "please ping"))
    processor = deployment.start(deployment.processor_args(), "processor")
    echo = deployment.start([TORPOR, "connector", "run-echo", "--group",
                             f"echo-{deployment.prefix}"], "echo")
    wait_until(lambda: "The echo said ping." in deployment.answers(thread_id), timeout=120,
               message=lambda: f"the final answer; processor log:\n{deployment.log('processor')[-3000:]}")
    for process in (processor, echo):
        process.send_signal(signal.SIGTERM)
    assert processor.wait(timeout=60) == 0, deployment.log("processor")[-3000:]
    assert echo.wait(timeout=60) == 0, deployment.log("echo")[-3000:]

    assert deployment.answers(thread_id) == ["Pinging.", "The echo said ping."]
    kinds = [type(i.body).__name__ for i in deployment.inputs() if i.thread_id == thread_id]
    assert kinds == ["CreateThread", "UserMessage", "Completion", "ToolResult", "Completion"]
    _assert_one_receipt_per_input(deployment)
    assert {r.disposition for r in deployment.receipts()} == {"applied"}
    dispatches = deployment.dispatches()
    assert [d.tool for d in dispatches] == ["echo"]
    assert len({d.request_id for d in dispatches}) == len(dispatches)
    # Loopback and completions land where any producer would put the thread.
    expected = partition_for(thread_id.encode(), PARTITIONS)
    assert {p for k, _, p in deployment.records("inputs") if k == thread_id.encode()} == {expected}
    assert {p for k, _, p in deployment.records("changelog")} <= set(range(PARTITIONS))


def _assert_exactly_once(deployment: Deployment) -> None:
    """Each input record has one receipt; each message id one non-duplicate; no dispatch twice."""
    copies = Counter(i.message_id for i in deployment.inputs())
    receipts = deployment.receipts()
    assert Counter(r.input_id for r in receipts) == copies
    decisive = Counter(r.input_id for r in receipts if r.disposition not in ("duplicate", "stale"))
    assert decisive == Counter(set(copies)), "an input folded twice (or never)"
    request_ids = Counter(d.request_id for d in deployment.dispatches())
    assert all(n == 1 for n in request_ids.values()), f"dispatched twice: {request_ids}"


def test_sigkilled_processor_restarts_and_every_turn_completes_exactly_once(deployment: Deployment) -> None:
    threads = [f"kill-{i:02d}-{uuid.uuid4().hex[:6]}" for i in range(30)]
    for thread_id in threads:
        deployment.send(*_conversation(thread_id, "please ping slowly"))
    echo = deployment.start([TORPOR, "connector", "run-echo", "--group", f"echo-{deployment.prefix}"], "echo")
    receipts = Tail(deployment.bootstrap, deployment.topic("receipts"))
    # 5 inputs per thread (create, text, completion, tool result, completion). The first
    # kill lands while every model call is in flight (the restart must re-issue them),
    # the next two among the tool results and the final completions.
    for kill, threshold in enumerate((60, 95, 125)):
        processor = deployment.start(deployment.processor_args(), f"processor-{kill}")
        wait_until(lambda t=threshold: receipts.count() >= t, timeout=120,  # type: ignore[misc]
                   message=f"{threshold} receipts before kill {kill}")
        processor.send_signal(signal.SIGKILL)
        processor.wait(timeout=30)
    processor = deployment.start(deployment.processor_args(), "processor-last")
    finals = Tail(deployment.bootstrap, deployment.topic("events"))

    def all_answered() -> bool:
        return len({thread for thread, text in finals.answers() if text == "The echo said ping."}) == 30

    wait_until(all_answered, timeout=180, message="every thread's final answer after the kills")
    # The answers may all predate this instance (the last kill can land late); a SIGTERM
    # before the interpreter has installed its handler would be an unclean death.
    wait_until(lambda: "started in group" in deployment.log("processor-last"), timeout=60,
               message="processor-last has started")
    for process in (processor, echo):
        process.send_signal(signal.SIGTERM)
    assert processor.wait(timeout=60) == 0, deployment.log("processor-last")[-3000:]
    # A completion a killed instance produced but never folded is re-issued by its successor
    # (the thread still awaited the model in the store): a second copy that can land after
    # the thread's final answer, even after processor-last's last read. One more instance,
    # to idle, receipts whatever is left, as any next owner of the partitions would.
    drained = deployment.run(deployment.processor_args("p0", "--until-idle"))
    assert drained.returncode == 0, drained.stderr[-4000:]
    answers: dict[str, list[str]] = {}
    for thread_id, text in finals.answers():
        answers.setdefault(thread_id, []).append(text)
    assert answers == {t: ["Pinging.", "The echo said ping."] for t in threads}
    _assert_exactly_once(deployment)


def test_until_idle_exits_once_the_model_answered_and_nothing_is_in_flight(deployment: Deployment) -> None:
    threads = [f"idle-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
    for thread_id in threads:
        deployment.send(*_conversation(thread_id, "hello"))
    result = deployment.run(deployment.processor_args("p0", "--until-idle"))
    assert result.returncode == 0, result.stderr[-4000:]
    for thread_id in threads:
        assert deployment.answers(thread_id) == ["Hello to you."]
    _assert_one_receipt_per_input(deployment)
    # A second run finds nothing to do and exits at once, folding nothing again.
    again = deployment.run(deployment.processor_args("p0", "--until-idle"))
    assert again.returncode == 0, again.stderr[-4000:]
    assert len(deployment.receipts()) == 3 * len(threads)


def test_a_poison_record_is_parked_with_a_receipt_and_the_partition_goes_on(deployment: Deployment) -> None:
    thread_id = f"poison-{uuid.uuid4().hex[:8]}"
    create, hello = _conversation(thread_id, "hello")
    deployment.send(create)
    deployment.send_raw(thread_id.encode(), b"not avro at all")
    deployment.send(hello)
    result = deployment.run(deployment.processor_args("p0", "--until-idle"))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "undecodable input parked" in result.stderr
    parked = deployment.records("parked")
    assert [(k, v) for k, v, _ in parked] == [(thread_id.encode(), b"not avro at all")]
    dispositions = Counter(r.disposition for r in deployment.receipts())
    assert dispositions == {"parked": 1, "applied": 3}
    assert deployment.answers(thread_id) == ["Hello to you."]


def test_a_wiped_store_is_rebuilt_from_the_changelog_and_the_thread_continues(deployment: Deployment) -> None:
    thread_id = f"wiped-{uuid.uuid4().hex[:8]}"
    deployment.send(*_conversation(thread_id, "hello"))
    assert deployment.run(deployment.processor_args("p0", "--until-idle")).returncode == 0
    for store in deployment.root.glob("stores-p0/partition-*"):
        subprocess.run(["rm", "-rf", str(store)], check=True)
    deployment.send(_input(thread_id, f"{thread_id}-again", 3_000, UserMessage((TextBlock("please ping"),))))
    echo = deployment.start([TORPOR, "connector", "run-echo", "--group",
                             f"echo-{deployment.prefix}"], "echo")
    processor = deployment.start(deployment.processor_args(), "processor")
    wait_until(lambda: "The echo said ping." in deployment.answers(thread_id), timeout=120,
               message=lambda: f"the thread continues; processor log:\n{deployment.log('processor')[-3000:]}")
    for process in (processor, echo):
        process.send_signal(signal.SIGTERM)
    assert processor.wait(timeout=60) == 0
    assert deployment.answers(thread_id) == ["Hello to you.", "Pinging.", "The echo said ping."]
    _assert_one_receipt_per_input(deployment)
