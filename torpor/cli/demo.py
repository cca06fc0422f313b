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

With `--ui`, the run does not end there: once it is checked, a second agent asks to
deploy (the deploy connector, an approval relay, runs beside the others) and waits for
a person's approval; the inspector (`torpor ui`, signed with an operator key of the run's
key ring) serves the run's threads, and its address is printed. Approving from the page
resumes that agent; the transcript keeps printing what happens. SIGINT (Ctrl-C), SIGTERM or
SIGHUP stops the page and the processes, then the topics are deleted (unless `--keep`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Final

import click
from confluent_kafka import KafkaException
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from torpor.cli.demorun import (
    Processes,
    RecordReader,
    asked_approval,
    await_until,
    check,
    said,
    settled,
    summary,
)
from torpor.cli.send import produce_inputs
from torpor.cli.settings import read_settings, settings_options
from torpor.cli.transcript import Transcript
from torpor.connectors.approvals import DEPLOY_SPEC
from torpor.connectors.echo import ECHO_SPEC
from torpor.schemas.codec import Codec
from torpor.schemas.errors import TorporError
from torpor.schemas.ids import derive_id
from torpor.schemas.keyring import KeyRing, KeyVersion, keyring_toml
from torpor.schemas.records import (
    Budgets,
    Capability,
    CreateThread,
    Input,
    TextBlock,
    ThreadConfig,
    ToolSpec,
    UserMessage,
)
from torpor.schemas.signer import Signer, SignerSettings, public_key_bytes, write_private_key
from torpor.streams.admin import ensure_topics
from torpor.streams.clients import make_admin
from torpor.streams.config import Settings
from torpor.streams.deadline import Deadline
from torpor.streams.topics import TopicNames

GATEWAY_KEY: Final = "demo-gateway"  # signs the user's inputs: grants the thread its tenant
OPERATOR_KEY: Final = "demo-operator"  # signs what a person does from the inspector (--ui)
OPERATOR: Final = "demo"
DEPLOY: Final = "torpor.connectors.approvals:DeployTool"
FINAL_ANSWER: Final = "The build is green, and I waited two seconds to be sure. Done."
DEPLOY_ASK: Final = "Deploy web to production, once a person approves."
DEPLOYED_ANSWER: Final = "Web is deployed. Done."
SCRIPT: Final = f"""\
[thread]
id = "unused"

[[model]]
last_contains = "deployed web"
[[model.turns]]
text = "{DEPLOYED_ANSWER}"

[[model]]
last_contains = "rejected by"
[[model.turns]]
text = "Understood: web stays as it is."

[[model]]
last_contains = "Deploy web"
[[model.turns]]
text = "Deploying web needs a person's approval; asking."
calls = [{{ name = "deploy", arguments = {{ target = "web" }} }}]

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


def _keys(root: Path) -> Path:
    """A private key per role (files mode 0600) and the key ring that trusts them.

    The gateway key signs the user's inputs: it grants the thread its tenant (`demo`),
    as a tenant's gateway would (docs/security.md); an unsigned user may only create
    threads in the public tenant.
    """
    versions = []
    for key_id, source, tools in (("demo-echo", "connector:echo", ("echo",)),
                                  ("demo-timer", "timer", ("timer",)),
                                  ("demo-deploy", "connector:deploy", ("deploy",)),
                                  ("demo-processor", "processor", ("*",)),
                                  (GATEWAY_KEY, "user:*", ("echo", "deploy")),
                                  (OPERATOR_KEY, "operator:*", ("*",))):
        key = Ed25519PrivateKey.generate()
        write_private_key(root / f"{key_id}.pem", key)
        versions.append(KeyVersion(key_id=key_id, public_key=public_key_bytes(key), sources=(source,),
                                   tools=tools, tenants=("demo",), valid_from=0, valid_until=None))
    ring = root / "keyring.toml"
    ring.write_text(keyring_toml(KeyRing(tuple(versions))))
    return ring


def _conversation(thread_id: str, now_ms: int, gateway: Signer, ask: str = "Check the build, then wait a "
                  "moment and report.", tool: ToolSpec = ECHO_SPEC) -> tuple[Input, Input]:
    config = ThreadConfig(
        model="scripted", system_prompt="You are a patient build agent.", tools=(tool,),
        capability=Capability(tenant="demo", tools=(tool.name,), scopes=(), expires_at=None),
        budgets=Budgets(max_turns=10, max_children=None, max_tool_retries=3, max_invalid_calls=3),
        parent=None, context_window=200_000, compaction_threshold=0.75, allow_implicit_create=False,
    )

    def envelope(label: str, offset: int, body: CreateThread | UserMessage) -> Input:
        return gateway.sign(Input(message_id=derive_id(thread_id, label), thread_id=thread_id,
                                  created_at=now_ms + offset, source="user:demo", expires_at=None,
                                  key_id=None, signature=None, body=body))

    return (envelope("create", 0, CreateThread(config=config, inherited=(), initial=())),
            envelope("ask", 1, UserMessage((TextBlock(ask),))))


@click.command()
@click.option("--keep", is_flag=True, help="Keep the run's topics (printed) instead of deleting them.")
@click.option("--ui", "with_ui", is_flag=True,
              help="Then stay up with the inspector (torpor ui) on the run's threads, one of them waiting "
                   "for your approval, until Ctrl-C.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="The inspector's port with --ui (0: any free one, printed).")
@settings_options
def demo(keep: bool, with_ui: bool, port: int, config_file: Path | None, bootstrap: str | None) -> None:
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
            _play(settings, names, Path(work), run_id, config_file, port if with_ui else None)
    finally:
        if keep:
            click.echo(f"kept the topics: TORPOR_TOPIC_PREFIX={prefix}")
        else:
            for future in admin.delete_topics(list(names.all()), operation_timeout=30).values():
                with contextlib.suppress(KafkaException):  # tidiness: the verdict is printed already
                    future.result(timeout=60)


def _play(settings: Settings, names: TopicNames, root: Path, run_id: str, config_file: Path | None,
          ui_port: int | None) -> None:
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
    run = Processes(root, env)
    # One process: one agent needs no second worker (the default would start one per core).
    run.start("processor", "processor", "--instance", "p0", "--app", f"demo-{run_id}", "--workers", "1",
              "--store-dir", str(root / "stores"), "--script", str(root / "script.toml"))
    connectors = [("echo", "run-echo", "demo-echo"), ("timers", "run-timers", "demo-timer")]
    if ui_port is not None:  # started now, so that it is up by the time the run is checked
        connectors.append(("deploy", "run", "demo-deploy"))
    for name, command, key_id in connectors:
        run.start(name, "connector", command, *([DEPLOY] if command == "run" else []),
                  "--group", f"demo-{run_id}-{name}", "--journal-dir", str(root / f"journal-{name}"),
                  "--signing-key-id", key_id, "--signing-key", str(root / f"{key_id}.pem"))
    start = time.monotonic_ns() // 1_000_000
    transcript = Transcript(clock=lambda: time.monotonic_ns() // 1_000_000 - start, emit=click.echo)
    codec = Codec.from_url(settings.schema_registry.url)
    thread_id = f"build-agent-{run_id}"
    problems: list[str] = []
    reader = RecordReader(settings, names, codec, transcript)
    try:
        try:
            gateway = Signer.from_settings(SignerSettings(GATEWAY_KEY, root / f"{GATEWAY_KEY}.pem"))
            produce_inputs(settings, _conversation(thread_id, time.time_ns() // 1_000_000, gateway))
        except TorporError as error:
            raise click.ClickException(f"the demo's inputs: {error}") from None
        problems.extend(await_until(run, reader, lambda: said(reader, thread_id, FINAL_ANSWER)
                                    and settled(reader), "the agent did not finish"))
        if not problems:
            problems.extend(check(reader))
        checked = summary(reader)
        if not problems and ui_port is not None:
            click.echo(f"checked: {checked}")
            problems.extend(_inspect(settings, run, reader, gateway, run_id, ui_port))
    finally:
        reader.close()
        problems.extend(run.stop())
    if problems:
        raise click.ClickException("the demo failed:\n  " + "\n  ".join(problems))
    click.echo(f"done: {'the inspector and ' if ui_port is not None else checked + ', '}"
               "every process stopped cleanly")


def _inspect(settings: Settings, run: Processes, reader: RecordReader, gateway: Signer, run_id: str,
             port: int) -> list[str]:
    """--ui: an agent waiting for an approval, the inspector on the run's threads, until a signal."""
    thread_id = f"deploy-agent-{run_id}"
    try:
        produce_inputs(settings, _conversation(thread_id, time.time_ns() // 1_000_000, gateway,
                                               DEPLOY_ASK, DEPLOY_SPEC))
    except TorporError as error:
        return [f"the deploying agent's inputs: {error}"]
    if problems := await_until(run, reader, lambda: asked_approval(reader, thread_id),
                          "the deploying agent did not ask for an approval"):
        return problems
    run.start("ui", "ui", "--port", str(port), "--app", f"demo-{run_id}",  # the processor's, for its lag
              "--operator", OPERATOR, "--signing-key-id", OPERATOR_KEY,
              "--signing-key", str(run.root / f"{OPERATOR_KEY}.pem"), ends_by_sigterm=True)
    address: list[str] = []

    def listening() -> bool:
        found = re.search(r"torpor ui: (http://\S+/)", (run.root / "ui.log").read_text(errors="replace"))
        address.extend(found.groups() if found else ())
        return bool(address)

    if problems := await_until(run, reader, listening, "torpor ui did not print its address"):
        return problems
    click.echo(f"\n== the inspector: {address[0]}\n"
               f"   {thread_id} waits for your approval: open it and press approve (signed as "
               f"operator:{OPERATOR}).\n   Ctrl-C stops the page and the run's processes.\n", nl=False)
    stopping = threading.Event()
    endings = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, a supervisor, the terminal closed
    previous = {s: signal.signal(s, lambda *_: stopping.set()) for s in endings}
    try:
        while not stopping.is_set():
            if (dead := run.dead()) is not None:
                return [dead]
            reader.poll()  # keeps the transcript going: the decision, the result, the answer
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    return []
