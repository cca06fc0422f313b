"""`torpor demo`: one agent, end to end through a real Kafka broker, exactly once and signed.

What it runs, as separate processes like a deployment: a processor (scripted model,
verifying inputs against a key ring made for the run, signing its own completions), the
echo connector and the timer connector, each signing its answers with its own key. It
creates a thread and asks it to check a build; the agent calls `echo`, sleeps two
seconds on a durable timer, and reports. Every record of the run is printed as it is
committed (inputs, dispatches, events, receipts, read_committed from the topics). Then
it checks what a user of Kafka would: every input has exactly one receipt, all
`applied`; every input not from the user (connector, timer, model completion) was
`verified`; no dispatch request id appears twice in the outbox; and each process
stopped cleanly. Any failure exits non-zero with the reason and the logs' tails.

Topics get a prefix of their own per run (`demo.<id>.`), deleted afterwards unless
`--keep` (then `torpor replay`, `torpor tail` and friends can look at them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import click
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from torpor.cli.send import produce_inputs
from torpor.cli.settings import read_settings, settings_options
from torpor.cli.transcript import Transcript
from torpor.connectors.echo import ECHO_SPEC
from torpor.schemas.codec import Codec
from torpor.schemas.errors import TorporError
from torpor.schemas.ids import derive_id
from torpor.schemas.keyring import KeyRing, KeyVersion, keyring_toml
from torpor.schemas.records import (
    VERIFIED,
    AssistantEntry,
    Budgets,
    Capability,
    CreateThread,
    Dispatch,
    Input,
    Receipt,
    TextBlock,
    ThreadConfig,
    ThreadEvent,
    UserMessage,
)
from torpor.schemas.signer import Signer, SignerSettings, public_key_bytes, write_private_key
from torpor.streams.admin import ensure_topics
from torpor.streams.clients import make_admin, make_consumer
from torpor.streams.config import Settings
from torpor.streams.deadline import Deadline
from torpor.streams.log import LogRecord
from torpor.streams.topics import TopicNames

GATEWAY_KEY: Final = "demo-gateway"  # signs the user's inputs: grants the thread its tenant
RUN_SECONDS: Final = 120.0
FINAL_ANSWER: Final = "The build is green, and I waited two seconds to be sure. Done."
SCRIPT: Final = f"""\
[thread]
id = "unused"

[[model]]
last_contains = "Slept for"
[[model.turns]]
text = "{FINAL_ANSWER}"

[[model]]
last_contains = "echo: build is green"
[[model.turns]]
text = "The build looks green. Waiting a moment before I report."
calls = [{{ name = "sleep", arguments = {{ seconds = 2, reason = "let it settle" }} }}]

[[model]]
last_contains = "Check the build"
[[model.turns]]
text = "Checking the build."
calls = [{{ name = "echo", arguments = {{ text = "build is green" }} }}]
"""


@dataclass
class _Run:
    """The processes of one demo run and where their logs go."""

    root: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)

    def start(self, name: str, *args: str) -> None:
        log = (self.root / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen([sys.executable, "-m", "torpor", *args], env=self.env,
                                                stdout=log, stderr=subprocess.STDOUT, cwd=self.root)

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
            if code != 0 and name not in self.reported:
                problems.append(f"{name} exited with {code}:\n{self.tail(name)}")
        return problems


def _keys(root: Path) -> Path:
    """A private key per role (files mode 0600) and the key ring that trusts them.

    The gateway key signs the user's inputs: it grants the thread its tenant (`demo`),
    as a tenant's gateway would (docs/security.md); an unsigned user may only create
    threads in the public tenant.
    """
    versions = []
    for key_id, source, tool in (("demo-echo", "connector:echo", "echo"), ("demo-timer", "timer", "timer"),
                                 ("demo-processor", "processor", "*"), (GATEWAY_KEY, "user:*", "echo")):
        key = Ed25519PrivateKey.generate()
        write_private_key(root / f"{key_id}.pem", key)
        versions.append(KeyVersion(key_id=key_id, public_key=public_key_bytes(key), sources=(source,),
                                   tools=(tool,), tenants=("demo",), valid_from=0, valid_until=None))
    ring = root / "keyring.toml"
    ring.write_text(keyring_toml(KeyRing(tuple(versions))))
    return ring


def _conversation(thread_id: str, now_ms: int, gateway: Signer) -> tuple[Input, Input]:
    config = ThreadConfig(
        model="scripted", system_prompt="You are a patient build agent.", tools=(ECHO_SPEC,),
        capability=Capability(tenant="demo", tools=("echo",), scopes=(), expires_at=None),
        budgets=Budgets(max_turns=10, max_children=None, max_tool_retries=3, max_invalid_calls=3),
        parent=None, context_window=200_000, compaction_threshold=0.75, allow_implicit_create=False,
    )

    def envelope(label: str, offset: int, body: CreateThread | UserMessage) -> Input:
        return gateway.sign(Input(message_id=derive_id(thread_id, label), thread_id=thread_id,
                                  created_at=now_ms + offset, source="user:demo", expires_at=None,
                                  key_id=None, signature=None, body=body))

    return (envelope("create", 0, CreateThread(config=config, inherited=(), initial=())),
            envelope("ask", 1, UserMessage((TextBlock("Check the build, then wait a moment and report."),))))


class _Reader:
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


def _answered(reader: _Reader, thread_id: str) -> bool:
    for event in reader.records[ThreadEvent]:
        assert isinstance(event, ThreadEvent)
        if event.thread_id == thread_id and event.kind == "turn_committed" and event.entry is not None:
            body = event.entry.body
            if isinstance(body, AssistantEntry) and any(
                    isinstance(b, TextBlock) and b.text == FINAL_ANSWER for b in body.content):
                return True
    return False


def _settled(reader: _Reader) -> bool:
    """Every input read so far has its receipt."""
    inputs = {i.message_id for i in reader.records[Input] if isinstance(i, Input)}
    receipts = {r.input_id for r in reader.records[Receipt] if isinstance(r, Receipt)}
    return inputs <= receipts


def _check(reader: _Reader) -> list[str]:
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


@click.command()
@click.option("--keep", is_flag=True, help="Keep the run's topics (printed) instead of deleting them.")
@settings_options
def demo(keep: bool, config_file: Path | None, bootstrap: str | None) -> None:
    """Run one agent through a real broker: processor, signed connectors, timers, exactly once."""
    base = read_settings(config_file, bootstrap)
    run_id = uuid.uuid4().hex[:8]
    prefix = f"demo.{run_id}."
    settings = Settings(kafka=base.kafka, topics=type(base.topics)(
        prefix=prefix, partitions=3, replication_factor=base.topics.replication_factor),
        schema_registry=base.schema_registry, inputs=base.inputs)
    names = TopicNames.for_prefix(prefix)
    admin = make_admin(settings)
    try:
        ensure_topics(admin, settings, Deadline.after(60.0))
    except TorporError as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"topics {prefix}* on {settings.kafka.bootstrap_servers}")
    try:
        with tempfile.TemporaryDirectory(prefix="torpor-demo-") as work:
            _play(settings, names, Path(work), run_id, config_file)
    finally:
        if keep:
            click.echo(f"kept the topics: TORPOR_TOPIC_PREFIX={prefix}")
        else:
            for future in admin.delete_topics(list(names.all()), operation_timeout=30).values():
                with contextlib.suppress(KafkaException):  # tidiness: the verdict is printed already
                    future.result(timeout=60)


def _play(settings: Settings, names: TopicNames, root: Path, run_id: str, config_file: Path | None) -> None:
    ring = _keys(root)
    (root / "script.toml").write_text(SCRIPT)
    env = {**os.environ, "TORPOR_BOOTSTRAP": settings.kafka.bootstrap_servers,
           "TORPOR_TOPIC_PREFIX": names.inputs.removesuffix("inputs"), "TORPOR_PARTITIONS": "3",
           "TORPOR_KEYRING": str(ring),
           "TORPOR_PROCESSOR_KEY_ID": "demo-processor",
           "TORPOR_PROCESSOR_KEY": str(root / "demo-processor.pem")}
    # The processes read the same settings file (security, librdkafka overrides); the
    # variables above win over it, as they do everywhere.
    if config_file is not None:
        env["TORPOR_CONFIG"] = str(config_file.resolve())
    run = _Run(root, env)
    run.start("processor", "processor", "--instance", "p0", "--app", f"demo-{run_id}",
              "--store-dir", str(root / "stores"), "--script", str(root / "script.toml"))
    for name, command, key_id in (("echo", "run-echo", "demo-echo"), ("timers", "run-timers", "demo-timer")):
        run.start(name, "connector", command, "--group", f"demo-{run_id}-{name}",
                  "--journal-dir", str(root / f"journal-{name}"),
                  "--signing-key-id", key_id, "--signing-key", str(root / f"{key_id}.pem"))
    start = time.monotonic_ns() // 1_000_000
    transcript = Transcript(clock=lambda: time.monotonic_ns() // 1_000_000 - start, emit=click.echo)
    codec = Codec.from_url(settings.schema_registry.url)
    thread_id = f"build-agent-{run_id}"
    problems: list[str] = []
    reader = _Reader(settings, names, codec, transcript)
    try:
        try:
            gateway = Signer.from_settings(SignerSettings(GATEWAY_KEY, root / f"{GATEWAY_KEY}.pem"))
            produce_inputs(settings, _conversation(thread_id, time.time_ns() // 1_000_000, gateway))
        except TorporError as error:
            raise click.ClickException(f"the demo's inputs: {error}") from None
        deadline = Deadline.after(RUN_SECONDS)
        while not (_answered(reader, thread_id) and _settled(reader)):
            if deadline.expired():
                problems.append(f"the agent did not finish within {RUN_SECONDS:.0f} s")
                break
            if (dead := run.dead()) is not None:
                problems.append(dead)
                break
            reader.poll()
        problems.extend(_check(reader))
    finally:
        reader.close()
        problems.extend(run.stop())
    if problems:
        raise click.ClickException("the demo failed:\n  " + "\n  ".join(problems))
    inputs = len(reader.records[Input])
    verified = sum(1 for r in reader.records[Receipt] if isinstance(r, Receipt) and r.provenance == VERIFIED)
    click.echo(f"done: {inputs} inputs, {inputs} receipts (all applied, {verified} signed and verified), "
               f"{len(reader.records[Dispatch])} dispatches (none twice), every process stopped cleanly")
