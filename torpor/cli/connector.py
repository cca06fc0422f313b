"""`torpor connector run|run-echo|run-timers`: serve a connector from the Kafka outbox.

The connector runtime (`torpor.connectors.runtime`): an effect journal in
`--journal-dir` (default `.torpor/connectors/<GROUP>`), reconcile at start, signed
answers with `--signing-key-id`/`--signing-key`. `run MODULE:NAME` imports NAME, a
factory `(sink, clock) -> connector` such as `torpor.connectors.echo:EchoTool`;
`run-echo` and `run-timers` are the built-in ones. Logs go to stderr; exit 0 after
SIGTERM/SIGINT, 1 for a configuration problem, 2 for a fatal error.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import click

from torpor.cli.logs import LOG_FORMAT_OPTION, announce, configure
from torpor.cli.metrics import serve_metrics
from torpor.cli.settings import default_group, read_settings, settings_options
from torpor.cli.traces import TRACES_OPTION, start_tracing, stop_tracing
from torpor.connectors.journal import EffectJournal
from torpor.connectors.metrics import ConnectorMetrics
from torpor.connectors.runtime import ConnectorFactory, ConnectorRuntime
from torpor.schemas.errors import ConfigError, TorporError
from torpor.schemas.signer import Signer, SignerSettings

ECHO: Final = "torpor.connectors.echo:EchoTool"
TIMERS: Final = "torpor.connectors.timers:TimerConnector"

_OPTIONS: Final = (
    click.option("--group", default=None,
                 help="Consumer group of the outbox. Default: torpor-connector-<NAME>, or "
                      "<topic prefix>connector-<NAME> under another topic prefix."),
    click.option("--journal-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                 help="The effect journal (RocksDB). Default: .torpor/connectors/<GROUP>. One per "
                      "connector process: two processes must not share it."),
    click.option("--signing-key-id", envvar="TORPOR_SIGNING_KEY_ID", default=None,
                 help="Sign every answer with this key id (or TORPOR_SIGNING_KEY_ID); its key "
                      "ring entry must allow this connector's source and tools."),
    click.option("--signing-key", envvar="TORPOR_SIGNING_KEY", default=None,
                 type=click.Path(dir_okay=False, path_type=Path),
                 help="The private key file of --signing-key-id (`torpor keys new` writes it), "
                      "or TORPOR_SIGNING_KEY."),
    click.option("--concurrency", type=int, default=None,
                 help="Run at most this many calls at once (default: no limit; leave it so for timers)."),
    click.option("--wait-for-topics/--no-wait-for-topics", default=True, show_default=True,
                 help="Wait (saying so once) for the outbox, inputs and toolsets topics if they do not "
                      "exist yet; with --no-wait-for-topics, name the missing ones and exit 1."),
    click.option("--metrics-port", type=click.IntRange(0, 65535), default=None, envvar="TORPOR_METRICS_PORT",
                 help="Serve Prometheus metrics on http://--metrics-host:PORT/metrics (0: any free port, "
                      "printed). Default: no metrics."),
    click.option("--metrics-host", default="127.0.0.1", show_default=True, help="The address of /metrics."),
    click.option("--log-level", default="info", show_default=True),
    LOG_FORMAT_OPTION,
    TRACES_OPTION,
)


def _connector_options(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(_OPTIONS):
        command = option(command)
    return settings_options(command)


@click.group("connector")
def connector() -> None:
    """Run tool connectors against the outbox."""


@connector.command("run")
@click.argument("target")
@_connector_options
def run(target: str, **options: Any) -> None:
    """Serve the connector TARGET (MODULE:NAME, a factory taking a sink and a clock)."""
    _serve(target, **options)


@connector.command("run-echo")
@_connector_options
def run_echo(**options: Any) -> None:
    """Serve the `echo` tool."""
    _serve(ECHO, **options)


@connector.command("run-timers")
@_connector_options
def run_timers(**options: Any) -> None:
    """Serve durable timers (`sleep`, `sleep_until`): they fire once, after any restart."""
    _serve(TIMERS, **options)


def _signer(key_id: str | None, key_file: Path | None) -> Signer | None:
    if key_id is None and key_file is None:
        return None
    if key_id is None or key_file is None:
        raise click.ClickException("--signing-key-id and --signing-key go together (one names the key, "
                                   "the other is its private key file)")
    try:
        return Signer.from_settings(SignerSettings(key_id, key_file))
    except ConfigError as error:
        raise click.ClickException(str(error)) from None


def _serve(target: str, *, group: str | None, journal_dir: Path | None, signing_key_id: str | None,
           signing_key: Path | None, concurrency: int | None, wait_for_topics: bool, metrics_port: int | None,
           metrics_host: str, log_level: str, log_format: str, traces: str, config_file: Path | None,
           bootstrap: str | None) -> None:
    configure(log_level, log_format)
    settings = read_settings(config_file, bootstrap)
    factory = import_factory(target)
    signer = _signer(signing_key_id, signing_key)
    name = target.rpartition(":")[2]
    group = group or default_group(settings, f"connector-{name}")
    journal_dir = journal_dir or Path(".torpor") / "connectors" / group
    try:
        journal = EffectJournal(journal_dir)
    except Exception as error:  # rocksdict raises a bare Exception for a locked or broken directory
        raise click.ClickException(f"effect journal {journal_dir}: cannot open it: {error} "
                                   "(is another connector process using it?)") from None
    metrics = None if metrics_port is None else ConnectorMetrics()
    try:
        tracing = start_tracing(traces, "torpor-connector")
        runner = ConnectorRuntime(settings, factory, group=group, journal=journal, signer=signer,
                                  max_concurrency=concurrency, wait_for_topics=wait_for_topics,
                                  observer=metrics, tracing=tracing)
        if metrics is not None and metrics_port is not None:
            server, _ = serve_metrics(metrics.registry, metrics_host, metrics_port)
            announce(f"metrics on http://{metrics_host}:{server.server_port}/metrics")
    except ConfigError as error:
        journal.close()
        raise click.ClickException(str(error)) from None
    stopping: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: stopping.append(number))
    try:
        asyncio.run(runner.run(lambda: bool(stopping)))
    except TorporError as error:
        announce(f"fatal: {type(error).__name__}: {error}", logging.CRITICAL)
        raise SystemExit(2) from None
    stop_tracing(tracing)
    announce(f"connector {name} stopped after {runner.handled} dispatches")


def import_factory(target: str) -> ConnectorFactory:
    """The connector factory MODULE:NAME names; a click error saying why it cannot be had."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise click.ClickException(f"connector {target!r} must be MODULE:NAME, e.g. {ECHO}")
    try:
        found: ConnectorFactory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise click.ClickException(f"cannot import connector {target!r}: {exc}") from None
    return found
