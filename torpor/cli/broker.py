"""`torpor broker start|stop|status`: a local Apache Kafka broker for development and tests.

Output contract, so scripts can use it: progress goes to stderr; `start` prints the
bootstrap address (`127.0.0.1:PORT`) as the last line of stdout, also when the broker
was already running. Exit codes: 0 ok; 1 the broker could not start (one-line cause on
stderr); `status` exits 3 when no broker runs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Final, NoReturn

import click

from torpor.schemas.errors import TorporError
from torpor.streams.broker import (
    DEFAULT_KAFKA_VERSION,
    BrokerSettings,
    broker_status,
    default_cache_dir,
    start_broker,
    stop_broker,
)

DEFAULT_BROKER_DIR: Final = Path(".torpor") / "broker"
EXIT_NOT_RUNNING: Final = 3

dir_option = click.option(
    "--dir",
    "broker_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_BROKER_DIR,
    show_default=True,
    help="Folder holding the broker's state file, log and data.",
)


def _say(message: str) -> None:
    click.echo(message, err=True)


def _fail(error: TorporError) -> NoReturn:
    click.echo(f"error: {error}", err=True)
    raise SystemExit(1)


@click.group()
def broker() -> None:
    """Run a single-node Apache Kafka broker (KRaft) on 127.0.0.1, fetched from Maven Central."""


@broker.command()
@click.option("--port", type=int, default=None, help="Broker port. Default: a free port.")
@dir_option
@click.option("--kafka-version", default=DEFAULT_KAFKA_VERSION, show_default=True)
def start(port: int | None, broker_dir: Path, kafka_version: str) -> None:
    """Start the broker detached and wait until it is ready; print its address last."""
    began = time.monotonic()
    try:
        settings = BrokerSettings(
            broker_dir=broker_dir,
            cache_dir=default_cache_dir(kafka_version, os.environ.get("TORPOR_CACHE_DIR")),
            kafka_version=kafka_version,
            port=port,
        )
        outcome = start_broker(settings, _say)
    except TorporError as error:
        _fail(error)
    state = outcome.state
    if outcome.already_running:
        _say(f"broker already running from {broker_dir}: pid {state.pid} on {state.bootstrap}")
    else:
        _say(f"broker ready in {time.monotonic() - began:.1f}s: pid {state.pid}, log {state.log_path}")
    click.echo(state.bootstrap)


@broker.command()
@dir_option
def stop(broker_dir: Path) -> None:
    """Stop the broker started from --dir (TERM, then KILL after a grace period)."""
    state = stop_broker(broker_dir)
    if state is None:
        click.echo(f"no broker running from {broker_dir}")
    else:
        click.echo(f"stopped broker pid {state.pid} on {state.bootstrap}")


@broker.command()
@dir_option
def status(broker_dir: Path) -> None:
    """Say whether the broker runs (exit 0) or not (exit 3)."""
    state = broker_status(broker_dir)
    if state is None:
        click.echo(f"stopped: no broker running from {broker_dir}")
        raise SystemExit(EXIT_NOT_RUNNING)
    click.echo(f"running: {state.bootstrap} pid {state.pid} (Kafka {state.kafka_version})")
