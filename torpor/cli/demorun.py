"""The machinery of a `torpor demo` run: its processes, the reader of its topics, its checks.

`Processes` starts `python -m torpor ...` children (each logging to a file of the run's
directory, in a session of its own so a terminal's Ctrl-C reaches the demo alone, and
sent SIGTERM by the kernel if the demo dies, on Linux) and stops them with SIGTERM,
reporting any that exited badly. `RecordReader` reads the run's
topics read_committed from the start, decoded, and hands each record to the transcript.
The predicates and `check` judge what it read: every input has exactly one receipt, all
`applied`, everything not from the user `verified`, no dispatch twice.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from torpor.cli.transcript import Transcript
from torpor.cli.workers import end_with_parent
from torpor.schemas.codec import Codec
from torpor.schemas.records import VERIFIED, AssistantEntry, Dispatch, Input, Receipt, TextBlock, ThreadEvent
from torpor.streams.clients import make_consumer
from torpor.streams.config import Settings
from torpor.streams.deadline import Deadline
from torpor.streams.log import LogRecord
from torpor.streams.topics import TopicNames

RUN_SECONDS: Final = 120.0  # how long each phase of a run may take before the demo gives up


@dataclass
class Processes:
    """The processes of one demo run and where their logs go."""

    root: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)
    ends_by_sigterm: set[str] = field(default_factory=set)

    def start(self, name: str, *args: str, ends_by_sigterm: bool = False) -> None:
        """Start `torpor ARGS` as `name`. `ends_by_sigterm`: it ends a clean shutdown by raising
        SIGTERM again (uvicorn does), so that ending is not reported as a failure."""
        # A session of their own: Ctrl-C in the terminal reaches the demo alone, which then
        # stops them in order (SIGTERM) and reports how each ended.
        if ends_by_sigterm:
            self.ends_by_sigterm.add(name)
        log = (self.root / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen([sys.executable, "-m", "torpor", *args], env=self.env,
                                                stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                                                start_new_session=True, preexec_fn=end_with_parent)

    def tail(self, name: str, lines: int = 15) -> str:
        text = (self.root / f"{name}.log").read_text(errors="replace").splitlines()
        return "\n".join(f"    {line}" for line in text[-lines:])

    def dead(self) -> str | None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                self.reported.add(name)
                return f"{name} exited with {process.returncode}:\n{self.tail(name)}"
        return None

    def stop(self) -> list[str]:
        problems = []
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for name, process in self.processes.items():
            try:
                code = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            clean = code == 0 or (code == -signal.SIGTERM and name in self.ends_by_sigterm)
            if not clean and name not in self.reported:
                problems.append(f"{name} exited with {code}:\n{self.tail(name)}")
        return problems


class RecordReader:
    """read_committed over the run's topics, decoded, handed to the transcript as they come."""

    def __init__(self, settings: Settings, names: TopicNames, codec: Codec, transcript: Transcript) -> None:
        self._codec = codec
        self._transcript = transcript
        self._types: dict[str, type] = {names.inputs: Input, names.outbox: Dispatch,
                                        names.events: ThreadEvent, names.receipts: Receipt}
        self._consumer: Consumer = make_consumer(settings, f"torpor-demo-{uuid.uuid4().hex}")
        assignment = []
        for topic in self._types:
            for partition in self._consumer.list_topics(topic, timeout=10.0).topics[topic].partitions:
                assignment.append(TopicPartition(topic, partition, 0))
        self._consumer.assign(assignment)
        self.records: dict[type, list[object]] = {t: [] for t in self._types.values()}

    def poll(self) -> None:
        for message in self._consumer.consume(500, timeout=0.2):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            topic = message.topic() or ""
            cls = self._types[topic]
            value: object = self._codec.decode(topic, message.value() or b"", cls,
                                               partition=message.partition(), offset=message.offset())
            self.records[cls].append(value)
            self._transcript.observe(LogRecord(topic, message.partition() or 0, message.offset() or 0,
                                               message.key() or b"", value))

    def close(self) -> None:
        self._consumer.close()


def said(reader: RecordReader, thread_id: str, answer: str) -> bool:
    """The thread committed a turn whose text is `answer`."""
    for event in reader.records[ThreadEvent]:
        assert isinstance(event, ThreadEvent)
        if event.thread_id == thread_id and event.kind == "turn_committed" and event.entry is not None:
            body = event.entry.body
            if isinstance(body, AssistantEntry) and any(
                    isinstance(b, TextBlock) and b.text == answer for b in body.content):
                return True
    return False


def asked_approval(reader: RecordReader, thread_id: str) -> bool:
    return any(isinstance(e, ThreadEvent) and e.thread_id == thread_id and e.kind == "approval_requested"
               for e in reader.records[ThreadEvent])


def settled(reader: RecordReader) -> bool:
    """Every input read so far has its receipt."""
    inputs = {i.message_id for i in reader.records[Input] if isinstance(i, Input)}
    receipts = {r.input_id for r in reader.records[Receipt] if isinstance(r, Receipt)}
    return inputs <= receipts


def check(reader: RecordReader) -> list[str]:
    problems: list[str] = []
    inputs = [i for i in reader.records[Input] if isinstance(i, Input)]
    receipts = [r for r in reader.records[Receipt] if isinstance(r, Receipt)]
    per_input = Counter(r.input_id for r in receipts)
    for record in inputs:
        if per_input[record.message_id] != 1:
            problems.append(f"input {record.message_id} has {per_input[record.message_id]} receipts, not 1")
    for receipt in receipts:
        if receipt.disposition != "applied":
            problems.append(f"input {receipt.input_id}: {receipt.disposition} ({receipt.reason})")
    signed = [r for r in receipts if r.input_id in {i.message_id for i in inputs if i.source != "user:demo"}]
    for receipt in signed:
        if receipt.provenance != VERIFIED:
            problems.append(f"input {receipt.input_id} from a connector or the processor was "
                            f"{receipt.provenance}, not verified")
    dispatches = Counter(d.request_id for d in reader.records[Dispatch] if isinstance(d, Dispatch))
    problems.extend(f"request {r} dispatched {n} times" for r, n in dispatches.items() if n > 1)
    return problems


def await_until(run: Processes, reader: RecordReader, condition: Callable[[], bool],
                failure: str) -> list[str]:
    """Read the topics until `condition` holds: no problem, or why not (a process died, time ran out)."""
    deadline = Deadline.after(RUN_SECONDS)
    while not condition():
        if deadline.expired():
            return [f"{failure} within {RUN_SECONDS:.0f} s"]
        if (dead := run.dead()) is not None:
            return [dead]
        reader.poll()
    return []


def summary(reader: RecordReader) -> str:
    inputs = len(reader.records[Input])
    verified = sum(1 for r in reader.records[Receipt] if isinstance(r, Receipt) and r.provenance == VERIFIED)
    return (f"{inputs} inputs, {inputs} receipts (all applied, {verified} signed and verified), "
            f"{len(reader.records[Dispatch])} dispatches (none twice)")
