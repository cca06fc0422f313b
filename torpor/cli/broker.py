"""`torpor broker start|stop|status`: a local Apache Kafka broker, or cluster, for development and tests.

`start` runs one node (`torpor.streams.broker`); `start --nodes 3` a three-node KRaft
cluster (`torpor.streams.cluster`), and on a dir whose cluster lost nodes it brings
those back on their own data. `stop` and `status` act on whichever the dir holds.

Output contract, so scripts can use it: progress goes to stderr; `start` prints the
bootstrap address (`127.0.0.1:PORT`, comma-separated for a cluster) as the last line of
stdout, also when it was already running. `status` prints `running: <bootstrap> ...`
(exit 0), `degraded: <bootstrap> ...` naming the nodes that are down (exit 4), or
`stopped: ...` (exit 3). Exit codes: 0 ok; 1 it could not start (one-line cause on stderr).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Final, NoReturn

import click

from torpor.schemas.errors import ConfigError, TorporError
from torpor.streams.broker import (
    DEFAULT_KAFKA_VERSION,
    BrokerSettings,
    broker_status,
    start_broker,
    stop_broker,
)
from torpor.streams.cluster import ClusterSettings, ClusterState, cluster_status, start_cluster, stop_cluster
from torpor.streams.kafka_jvm import default_cache_dir

DEFAULT_BROKER_DIR: Final = Path(".torpor") / "broker"
EXIT_NOT_RUNNING: Final = 3
EXIT_DEGRADED: Final = 4

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
    """Run Apache Kafka (KRaft) on 127.0.0.1, one node or a cluster, fetched from Maven Central."""


@broker.command()
@click.option("--port", type=int, default=None, help="Broker port (one node only). Default: a free port.")
@click.option("--nodes", type=int, default=1, show_default=True,
              help="1: a single broker. 3 or more: a KRaft cluster of combined broker+controller nodes "
                   "(replication factor 3, min.insync.replicas 2); on a cluster with nodes down, "
                   "starts those again on their own data.")
@dir_option
@click.option("--kafka-version", default=DEFAULT_KAFKA_VERSION, show_default=True)
def start(port: int | None, nodes: int, broker_dir: Path, kafka_version: str) -> None:
    """Start the broker (or cluster) detached and wait until it is ready; print its address last."""
    began = time.monotonic()
    cache_dir = default_cache_dir(kafka_version, os.environ.get("TORPOR_CACHE_DIR"))
    if nodes != 1:
        if port is not None:
            _fail(ConfigError("--port applies to a single broker: a cluster's nodes take free ports"))
        _start_cluster(broker_dir, cache_dir, nodes, kafka_version, began)
        return
    cluster = cluster_status(broker_dir)
    if cluster is not None and cluster.running:
        _fail(ConfigError(f"a {len(cluster.nodes)}-node cluster runs from {broker_dir}: pass "
                          f"--nodes {len(cluster.nodes)}, or stop it first"))
    try:
        settings = BrokerSettings(
            broker_dir=broker_dir, cache_dir=cache_dir, kafka_version=kafka_version, port=port
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


def _start_cluster(broker_dir: Path, cache_dir: Path, nodes: int, kafka_version: str, began: float) -> None:
    try:
        settings = ClusterSettings(
            broker_dir=broker_dir, cache_dir=cache_dir, nodes=nodes, kafka_version=kafka_version
        )
        outcome = start_cluster(settings, _say)
    except TorporError as error:
        _fail(error)
    state = outcome.state
    pids = ", ".join(f"node {node.node_id} pid {node.pid}" for node in state.nodes)
    if outcome.already_running:
        _say(f"cluster already running from {broker_dir}: {pids}")
    elif outcome.restarted:
        back = ", ".join(str(node_id) for node_id in outcome.restarted)
        _say(f"node(s) {back} back in {time.monotonic() - began:.1f}s: {pids}")
    else:
        _say(f"cluster of {nodes} ready in {time.monotonic() - began:.1f}s: {pids}")
    click.echo(state.bootstrap)


@broker.command()
@dir_option
def stop(broker_dir: Path) -> None:
    """Stop the broker or cluster started from --dir (TERM, then KILL after a grace period)."""
    if cluster_status(broker_dir) is not None:
        cluster = stop_cluster(broker_dir)
        if cluster is None:
            click.echo(f"no cluster node running from {broker_dir}")
        else:
            click.echo(f"stopped the {len(cluster.nodes)}-node cluster on {cluster.bootstrap}")
        return
    state = stop_broker(broker_dir)
    if state is None:
        click.echo(f"no broker running from {broker_dir}")
    else:
        click.echo(f"stopped broker pid {state.pid} on {state.bootstrap}")


@broker.command()
@dir_option
def status(broker_dir: Path) -> None:
    """Say whether the broker or cluster runs (exit 0), runs with nodes down (exit 4), or not (exit 3)."""
    cluster = cluster_status(broker_dir)
    if cluster is not None:
        _cluster_status(broker_dir, cluster)
        return
    state = broker_status(broker_dir)
    if state is None:
        click.echo(f"stopped: no broker running from {broker_dir}")
        raise SystemExit(EXIT_NOT_RUNNING)
    click.echo(f"running: {state.bootstrap} pid {state.pid} (Kafka {state.kafka_version})")


def _cluster_status(broker_dir: Path, cluster: ClusterState) -> None:
    up = cluster.running
    if not up:
        click.echo(f"stopped: no cluster node running from {broker_dir}")
        raise SystemExit(EXIT_NOT_RUNNING)
    nodes = ", ".join(f"node {node.node_id} " + (f"pid {node.pid}" if node in up else "DOWN")
                      for node in cluster.nodes)
    if len(up) < len(cluster.nodes):
        again = f"torpor broker start --nodes {len(cluster.nodes)} --dir {broker_dir}"
        click.echo(f"degraded: {cluster.bootstrap} {len(up)}/{len(cluster.nodes)} nodes up: {nodes} "
                   f"(`{again}` brings them back)")
        raise SystemExit(EXIT_DEGRADED)
    click.echo(f"running: {cluster.bootstrap} {len(up)}/{len(cluster.nodes)} nodes up: {nodes} "
               f"(Kafka {cluster.kafka_version})")
