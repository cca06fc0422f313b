"""`torpor send THREAD TEXT`: a user message to a thread, from the command line.

Output contract: the message id of each input produced, one per line (`created <id>`
first with `--new`), after the broker acknowledged it; exit 1 with the reason if it did
not. With `--wait SECONDS`, then one `receipt <id> <disposition> (<reason>)` line per
input as the processor folds it; exit 1 if one is neither applied nor a duplicate, or
if a receipt did not come in time. The input goes to the thread's partition of `inputs`
(Java-compatible murmur2, like every producer), source `user:<name>`. `--message-id`
makes a retried send a duplicate the fold absorbs; without it every send is a new message.

`--new` creates the thread first. Its configuration comes from `--thread-config FILE`
(TOML, the keys below) and flags, flags winning::

    model = "openai:gpt-4o-mini"        # or "anthropic:claude-...", "scripted"
    instructions = "You are a careful build agent."
    tools = ["echo", "run_command"]     # resolved from the toolsets topic
    tenant = "default"
    scopes = []
    max_turns = 50
    context_window = 200000
    compaction_threshold = 0.75

Tools are granted by name and resolved to their full definitions from the manifests
connectors publish on `toolsets` (the fold never looks anything up): a name no connector
published is an error that lists the ones that are.
"""

from __future__ import annotations

import getpass
import time
import tomllib
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import click

from torpor.cli.settings import read_settings, settings_options
from torpor.cli.signing import signer_for, signing_options, wire_id
from torpor.cli.traces import TRACES_OPTION, start_tracing, stop_tracing
from torpor.connectors.manifest import read_toolsets
from torpor.schemas.codec import Codec
from torpor.schemas.errors import ConfigError, TorporError
from torpor.schemas.ids import derive_id
from torpor.schemas.records import (
    APPLIED,
    DUPLICATE,
    Budgets,
    Capability,
    CreateThread,
    Input,
    InputBody,
    Receipt,
    TextBlock,
    ThreadConfig,
    ToolSpec,
    UserMessage,
)
from torpor.streams.clients import make_producer
from torpor.streams.config import Settings
from torpor.streams.deadline import Deadline
from torpor.streams.observer import Observed, Observer, Position
from torpor.streams.partitioner import partition_for
from torpor.streams.topics import TopicNames

Headers = tuple[tuple[str, bytes], ...]
"""Record headers, as `torpor.streams.tracing.Headers` (not imported: the otel extra is optional)."""
FLUSH_SECONDS: Final = 30.0
_CONFIG_KEYS: Final = frozenset(
    {
        "model",
        "instructions",
        "tools",
        "tenant",
        "scopes",
        "max_turns",
        "context_window",
        "compaction_threshold",
    }
)


def produce_inputs(settings: Settings, records: Sequence[Input], headers: Headers = ()) -> None:
    """Produce `records` to `inputs`, each on its thread's partition, in order; wait for the acks.

    `headers` go on every record (a trace context: `torpor.streams.tracing`; none by default).

    Raises `TorporError` if the topic is missing or the broker does not acknowledge them.
    """
    topic = TopicNames.for_prefix(settings.topics.prefix).inputs
    producer = make_producer(settings)
    metadata = producer.list_topics(topic, timeout=10.0).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        raise TorporError(
            f"topic {topic} does not exist (is the topic prefix right, and has a processor "
            "created the topics?)"
        )
    codec = Codec.from_url(settings.schema_registry.url)
    failures: list[str] = []

    def delivered(error: object, _: object) -> None:
        if error is not None:
            failures.append(str(error))

    for record in records:
        key = record.thread_id.encode("utf-8")
        producer.produce(
            topic,
            key=key,
            value=codec.encode(topic, record),
            partition=partition_for(key, len(metadata.partitions)),
            on_delivery=delivered,
            headers=list(headers) or None,
        )
    if producer.flush(FLUSH_SECONDS) > 0:
        raise TorporError(f"the broker did not acknowledge the input within {FLUSH_SECONDS:.0f} s")
    if failures:
        raise TorporError(f"the broker refused the input: {failures[0]}")


def default_source() -> str:
    return f"user:{getpass.getuser()}"


def envelope(thread: str, message_id: str, source: str, body: InputBody) -> Input:
    return Input(
        message_id=message_id,
        thread_id=thread,
        created_at=time.time_ns() // 1_000_000,
        source=source,
        expires_at=None,
        key_id=None,
        signature=None,
        body=body,
    )


def thread_config(options: dict[str, object], settings: Settings) -> ThreadConfig:
    """The `ThreadConfig` of `options` (file keys, flags merged). Raises `click.UsageError` when wrong."""
    unknown = set(options) - _CONFIG_KEYS
    if unknown:
        raise click.UsageError(f"unknown thread config keys {sorted(unknown)}; known: {sorted(_CONFIG_KEYS)}")
    try:
        names = [str(n) for n in _list(options.get("tools", []))]
        tenant = str(options.get("tenant", "default"))
        config = ThreadConfig(
            model=str(options.get("model", "scripted")),
            system_prompt=str(options.get("instructions", "")),
            tools=_resolve(names, settings) if names else (),
            capability=Capability(
                tenant=tenant,
                tools=tuple(names),
                scopes=tuple(str(s) for s in _list(options.get("scopes", []))),
                expires_at=None,
            ),
            budgets=Budgets(
                max_turns=_int(options.get("max_turns", 50)),
                max_children=None,
                max_tool_retries=3,
                max_invalid_calls=3,
            ),
            parent=None,
            context_window=_int(options.get("context_window", 200_000)),
            compaction_threshold=float(str(options.get("compaction_threshold", 0.75))),
            allow_implicit_create=False,
        )
    except (TypeError, ValueError) as error:
        raise click.UsageError(f"bad thread config: {error}") from None
    return config


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r}")
    return value


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"expected an integer, got {value!r}")
    return int(value)


TOOLS_WAIT_S: Final = 30.0
"""How long `--tool` waits for a connector to publish a tool: one started a moment ago
(the README's by-hand flow) publishes its manifest within a few seconds."""


def _resolve(names: list[str], settings: Settings) -> tuple[ToolSpec, ...]:
    deadline = time.monotonic() + TOOLS_WAIT_S
    said = False
    while True:
        try:
            published = {spec.name: spec for m in read_toolsets(settings).values() for spec in m.specs}
        except TorporError as error:
            raise click.ClickException(f"cannot read the toolsets topic to resolve {names}: {error}") \
                from None
        missing = [n for n in names if n not in published]
        if not missing:
            return tuple(published[n] for n in names)
        if time.monotonic() >= deadline:
            raise click.UsageError(
                f"no connector published the tools {missing} within {TOOLS_WAIT_S:g} s; published: "
                f"{sorted(published) or 'none (start the connectors first)'}"
            )
        if not said:
            click.echo(f"waiting up to {TOOLS_WAIT_S:g} s for a connector to publish {missing}", err=True)
            said = True
        time.sleep(0.5)


@click.command("send")
@click.argument("thread", callback=wire_id)
@click.argument("text")
@click.option(
    "--new", is_flag=True, help="Create the thread first (with --thread-config and the flags below)."
)
@click.option(
    "--thread-config",
    "thread_config_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="TOML file with the new thread's model, instructions, tools, tenant, budgets.",
)
@click.option("--model", default=None, help="The new thread's model (openai:<m>, anthropic:<m>, scripted).")
@click.option("--tool", "tools", multiple=True, help="A tool to grant the new thread (repeatable).")
@click.option("--instructions", default=None, help="The new thread's system prompt.")
@click.option("--source", default=None, help="The input's source (default user:<login name>).")
@click.option("--message-id", default=None, callback=wire_id,
              help="A stable id, so a retried send is a duplicate.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Wait this long for the receipts and print them; exit 1 if one is not applied.")
@TRACES_OPTION
@signing_options
@settings_options
def send(
    thread: str,
    text: str,
    new: bool,
    thread_config_file: Path | None,
    model: str | None,
    tools: tuple[str, ...],
    instructions: str | None,
    source: str | None,
    message_id: str | None,
    wait_s: float | None,
    signing_key_id: str | None,
    signing_key: Path | None,
    traces: str,
    config_file: Path | None,
    bootstrap: str | None,
) -> None:
    """Send TEXT to THREAD as a user message (with --new, create the thread first).

    A thread in a tenant other than `default` takes user input only signed by one of
    that tenant's gateway keys (--signing-key-id, --signing-key) when the processor has a
    key ring; so does creating one.
    """
    settings = read_settings(config_file, bootstrap)
    signer = signer_for(signing_key_id, signing_key)
    who = source or default_source()
    if not who.startswith("user:"):
        raise click.UsageError(f"--source must be user:<name>, got {who!r} (other sources must sign)")
    if not new and (thread_config_file or model or tools or instructions):
        raise click.UsageError(
            "--thread-config, --model, --tool and --instructions configure a new thread: add --new"
        )
    message_id = message_id or derive_id(thread, "send", uuid.uuid4().hex)
    records: list[Input] = []
    if new:
        options: dict[str, object] = {}
        if thread_config_file is not None:
            try:
                options.update(tomllib.loads(thread_config_file.read_text()))
            except tomllib.TOMLDecodeError as error:
                raise click.UsageError(f"{thread_config_file}: {error}") from None
        options.update(
            {
                k: v
                for k, v in (
                    ("model", model),
                    ("instructions", instructions),
                    ("tools", list(tools) if tools else None),
                )
                if v is not None
            }
        )
        config = thread_config(options, settings)
        records.append(
            envelope(
                thread,
                derive_id(message_id, "create"),
                who,
                CreateThread(config=config, inherited=(), initial=()),
            )
        )
    records.append(envelope(thread, message_id, who, UserMessage((TextBlock(text),))))
    if signer is not None:
        records = [signer.sign(r) for r in records]
    try:
        tracing = start_tracing(traces, "torpor-send")
    except ConfigError as error:
        raise click.ClickException(str(error)) from None
    if tracing is None:
        deliver(settings, thread, records, wait_s, _announce)
        return
    from opentelemetry.trace import SpanKind  # tracing is on: the otel extra is there

    # One trace from here: the fold of each input, its model calls, tools and results.
    span = tracing.start(f"send {type(records[-1].body).__name__}", None, SpanKind.PRODUCER, {
        "messaging.system": "kafka", "messaging.operation.type": "send",
        "torpor.thread_id": thread, "torpor.message_id": records[-1].message_id})
    try:
        deliver(settings, thread, records, wait_s, _announce, tracing.headers(span))
    finally:
        span.end()
        stop_tracing(tracing)


def _announce(records: list[Input]) -> None:
    for record in records:
        said = "created" if isinstance(record.body, CreateThread) else "sent"
        click.echo(f"{said} {record.message_id}")


WAIT_OPTION_HELP: Final = ("Wait this long for the receipt and print it; exit 1 if it is not applied "
                           "or does not come (0: do not wait).")
"""The `--wait` of commands that wait for their receipt by default (`control`, `approve`)."""


def deliver(settings: Settings, thread: str, records: list[Input], wait_s: float | None,
            announce: Callable[[list[Input]], None], headers: Headers = ()) -> None:
    """Produce `records` to `thread`, `announce` them once the broker has them, then (with a
    `wait_s` other than None or 0) print each one's receipt as the processor folds it: exit 1
    (a `ClickException`) if one is refused or does not come in time."""
    try:
        if not wait_s:
            produce_inputs(settings, records, headers)
            announce(records)
            return
        with Observer(settings, receipts=True) as observer:
            # The receipts' end before producing: what the wait reads from, so none is missed.
            start = observer.start(at_end=True, threads=[thread])
            produce_inputs(settings, records, headers)
            announce(records)
            _await_receipts(observer, start, thread, [r.message_id for r in records], wait_s)
    except TorporError as error:
        raise click.ClickException(str(error)) from None


def _await_receipts(observer: Observer, start: Position, thread: str, ids: list[str], wait_s: float) -> None:
    waiting = set(ids)
    refused: list[str] = []
    try:
        for item in observer.follow(start, threads=[thread], deadline=Deadline.after(wait_s)):
            receipt = item.record if isinstance(item, Observed) else None
            if isinstance(receipt, Receipt) and receipt.input_id in waiting:
                waiting.discard(receipt.input_id)
                reason = f" ({receipt.reason})" if receipt.reason else ""
                click.echo(f"receipt {receipt.input_id} {receipt.disposition}{reason}")
                if receipt.disposition not in (APPLIED, DUPLICATE):
                    refused.append(receipt.input_id)
                if not waiting:
                    break
    except TimeoutError:
        raise click.ClickException(f"no receipt for {sorted(waiting)} within {wait_s:g} s: the input is on "
                                   "the topic; is a processor running for this topic prefix?") from None
    if refused:
        raise click.ClickException(f"not applied: {', '.join(refused)}")
