"""`torpor connector run|run-echo`: serve an in-process connector from the Kafka outbox.

A minimal runner (see `torpor.connectors.outbox`), not the full connector runtime.
`run MODULE:NAME` imports NAME, a factory `(sink, clock) -> connector` such as
`torpor.connectors.echo:EchoTool`; `run-echo` is that one. Logs go to stderr; exit 0
after SIGTERM/SIGINT, 1 for a configuration problem, 2 for a fatal error.
"""

from __future__ import annotations

import asyncio
import importlib
import signal
import sys
from pathlib import Path
from typing import Final

import click

from torpor.cli.logs import configure
from torpor.cli.settings import read_settings, settings_options
from torpor.connectors.outbox import ConnectorFactory, OutboxRunner
from torpor.schemas.errors import ConfigError, TorporError

ECHO: Final = "torpor.connectors.echo:EchoTool"


@click.group("connector")
def connector() -> None:
    """Run tool connectors against the outbox (minimal runner; the full runtime is a later issue)."""


@connector.command("run")
@click.argument("target")
@click.option("--group", default=None, help="Consumer group of the outbox. Default: torpor-connector-<NAME>.")
@click.option("--log-level", default="info", show_default=True)
@settings_options
def run(target: str, group: str | None, log_level: str, config_file: Path | None,
        bootstrap: str | None) -> None:
    """Serve the connector TARGET (MODULE:NAME, a factory taking a sink and a clock)."""
    _serve(target, group, log_level, config_file, bootstrap)


@connector.command("run-echo")
@click.option("--group", default=None, help="Outbox consumer group. Default: torpor-connector-EchoTool.")
@click.option("--log-level", default="info", show_default=True)
@settings_options
def run_echo(group: str | None, log_level: str, config_file: Path | None, bootstrap: str | None) -> None:
    """Serve the `echo` tool."""
    _serve(ECHO, group, log_level, config_file, bootstrap)


def _serve(target: str, group: str | None, log_level: str, config_file: Path | None,
           bootstrap: str | None) -> None:
    configure(log_level)
    settings = read_settings(config_file, bootstrap)
    factory = _import(target)
    name = target.rpartition(":")[2]
    try:
        runner = OutboxRunner(settings, factory, group=group or f"torpor-connector-{name}")
    except ConfigError as error:
        raise click.ClickException(str(error)) from None
    stopping: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: stopping.append(number))
    try:
        asyncio.run(runner.run(lambda: bool(stopping)))
    except TorporError as error:
        print(f"fatal: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    click.echo(f"connector {name} stopped after {runner.handled} dispatches", err=True)


def _import(target: str) -> ConnectorFactory:
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise click.ClickException(f"connector {target!r} must be MODULE:NAME, e.g. {ECHO}")
    try:
        found: ConnectorFactory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise click.ClickException(f"cannot import connector {target!r}: {exc}") from None
    return found
