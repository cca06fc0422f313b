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
from collections.abc import Callable
from pathlib import Path
from typing import Final

import click

from torpor.cli.logs import configure
from torpor.cli.settings import read_settings, settings_options
from torpor.connectors.outbox import ConnectorFactory, OutboxRunner
from torpor.connectors.signer import Signer, SignerSettings
from torpor.schemas.errors import ConfigError, TorporError

ECHO: Final = "torpor.connectors.echo:EchoTool"


@click.group("connector")
def connector() -> None:
    """Run tool connectors against the outbox (minimal runner; the full runtime is a later issue)."""


signing_options = (
    click.option("--signing-key-id", envvar="TORPOR_SIGNING_KEY_ID", default=None,
                 help="Sign every answer with this key id (or TORPOR_SIGNING_KEY_ID); its key "
                      "ring entry must allow this connector's source and tools."),
    click.option("--signing-key", "signing_key", envvar="TORPOR_SIGNING_KEY", default=None,
                 type=click.Path(dir_okay=False, path_type=Path),
                 help="The private key file of --signing-key-id (`torpor keys new` writes it), "
                      "or TORPOR_SIGNING_KEY."),
)


def _signing(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(signing_options):
        command = option(command)
    return command


@connector.command("run")
@click.argument("target")
@click.option("--group", default=None, help="Consumer group of the outbox. Default: torpor-connector-<NAME>.")
@click.option("--log-level", default="info", show_default=True)
@_signing
@settings_options
def run(target: str, group: str | None, log_level: str, signing_key_id: str | None,
        signing_key: Path | None, config_file: Path | None, bootstrap: str | None) -> None:
    """Serve the connector TARGET (MODULE:NAME, a factory taking a sink and a clock)."""
    _serve(target, group, log_level, _signer(signing_key_id, signing_key), config_file, bootstrap)


@connector.command("run-echo")
@click.option("--group", default=None, help="Outbox consumer group. Default: torpor-connector-EchoTool.")
@click.option("--log-level", default="info", show_default=True)
@_signing
@settings_options
def run_echo(group: str | None, log_level: str, signing_key_id: str | None, signing_key: Path | None,
             config_file: Path | None, bootstrap: str | None) -> None:
    """Serve the `echo` tool."""
    _serve(ECHO, group, log_level, _signer(signing_key_id, signing_key), config_file, bootstrap)


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


def _serve(target: str, group: str | None, log_level: str, signer: Signer | None, config_file: Path | None,
           bootstrap: str | None) -> None:
    configure(log_level)
    settings = read_settings(config_file, bootstrap)
    factory = _import(target)
    name = target.rpartition(":")[2]
    try:
        runner = OutboxRunner(settings, factory, group=group or f"torpor-connector-{name}", signer=signer)
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
