"""A local multi-node KRaft cluster that Torpor starts itself: `torpor broker start --nodes 3`.

Contract:

- `start_cluster(settings, say)` runs `settings.nodes` Kafka nodes on 127.0.0.1, each in
  `<dir>/node-<id>/` (properties, log, data), detached in its own session. Every node is
  a broker and a controller, and the controllers form a static quorum of all the nodes.
  Replication follows the node count (`topics.replication_for`: three nodes give three
  copies of every topic, internal ones included, and `min.insync.replicas=2`), and topics
  are never auto-created, like the single broker of `torpor.streams.broker`.
  It returns once the cluster is ready: every broker registered, the warm-up topic
  replicated on all of them, one transaction and one group commit done.
  - No node of the dir runs: a fresh cluster (new id, fresh logs, free ports).
  - Some run: the others start again on their own data and ports (a node brought back
    after a crash rejoins its cluster and catches up), and it returns once all are back.
  - All run: it returns them (`already_running`).
- `stop_cluster(dir)` stops every node by its own pid, one at a time while a quorum lasts.
- `cluster_status(dir)` reads the state file; each node says whether its pid still runs.

Why combined broker+controller nodes rather than three brokers beside three controllers:
on a two-core machine three JVMs start in about half the time of six and leave the CPU to
the processes under test; a voter quorum of three still survives the loss of any one
node, and killing a node that is both the partition leader and the active controller
makes the clients ride through a leader election and a controller election at once.
Kafka's documentation keeps combined mode for development clusters, which this is.

Errors are those of `torpor.streams.broker`; a dir whose cluster has another node
count, or that holds a single broker, is a `ConfigError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Final

from torpor.schemas.errors import ConfigError
from torpor.streams.broker import (
    DEFAULT_KAFKA_VERSION,
    LOG_FILE,
    BrokerStartError,
    alive_check,
    broker_status,
    new_cluster_id,
    server_properties,
    wait_ready,
    write_state_file,
)
from torpor.streams.kafka_jvm import (
    BROKER_JVM_FLAGS,
    HOST,
    LOG4J_PROPERTIES,
    TOOL_JVM_FLAGS,
    check_kafka_version,
    class_sharing,
    free_port,
    is_our_broker,
    java_command,
    kill_gracefully,
    last_lines,
    pid_alive,
    publish_class_archive,
    require_tool,
    resolve_kafka,
)

CLUSTER_STATE_FILE: Final = "cluster.json"
# Two voters stop as soon as either does; one node is `torpor.streams.broker`'s job.
MIN_NODES: Final = 3
# Each node is a JVM with its heap: nine is far past what a laptop should run.
MAX_NODES: Final = 9
# A node whose controllers lost their quorum never finishes a controlled shutdown; a
# moment to flush its log, then KILL.
QUORUMLESS_GRACE: Final = 2.0


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """How to run a local cluster. Built by the command line; nothing here reads the environment."""

    broker_dir: Path
    cache_dir: Path
    nodes: int = 3
    kafka_version: str = DEFAULT_KAFKA_VERSION
    heap: str = "512m"  # per node: enough for tests, 1.5 GiB for three
    # Three JVMs starting at once on two cores take several times one's start; this only
    # bounds a wedged one.
    ready_timeout: float = 300.0

    def __post_init__(self) -> None:
        if not MIN_NODES <= self.nodes <= MAX_NODES:
            raise ConfigError(
                f"--nodes {self.nodes}: a cluster has {MIN_NODES} to {MAX_NODES} nodes (two voters stop "
                "when either does); use --nodes 1 for a single broker"
            )
        check_kafka_version(self.kafka_version)


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node of the cluster: its id, the pid of its last start, its ports and its folder."""

    node_id: int
    pid: int
    port: int
    controller_port: int
    node_dir: str

    @property
    def log_path(self) -> Path:
        return Path(self.node_dir) / LOG_FILE

    @property
    def running(self) -> bool:
        """True while this node's own JVM runs (a recycled pid is never taken for it)."""
        return is_our_broker(self.pid, Path(self.node_dir))


@dataclass(frozen=True, slots=True)
class ClusterState:
    """What the state file of a cluster dir records."""

    cluster_id: str
    kafka_version: str
    nodes: tuple[NodeState, ...]
    # Where node 1 dumps the class archive at exit, when there was none; `stop_cluster` publishes it.
    class_archive_pending: str | None = None

    @property
    def bootstrap(self) -> str:
        """Every node's address: a client reaches the cluster while any one of them is up."""
        return ",".join(f"{HOST}:{node.port}" for node in self.nodes)

    @property
    def running(self) -> tuple[NodeState, ...]:
        return tuple(node for node in self.nodes if node.running)

    def node(self, node_id: int) -> NodeState:
        return next(node for node in self.nodes if node.node_id == node_id)

    def write(self, broker_dir: Path) -> None:
        write_state_file(broker_dir / CLUSTER_STATE_FILE, asdict(self))

    @classmethod
    def read(cls, broker_dir: Path) -> ClusterState | None:
        try:
            raw = json.loads((broker_dir / CLUSTER_STATE_FILE).read_text())
            nodes = tuple(NodeState(**node) for node in raw.pop("nodes"))
            return cls(nodes=nodes, **raw)
        except (OSError, ValueError, TypeError, KeyError):
            return None


@dataclass(frozen=True, slots=True)
class ClusterStartOutcome:
    state: ClusterState
    already_running: bool
    restarted: tuple[int, ...]  # node ids brought back on their own data


def cluster_status(broker_dir: Path) -> ClusterState | None:
    """The cluster recorded in `broker_dir` (check `running` for who is up), or None if there is none."""
    return ClusterState.read(broker_dir.resolve())


def start_cluster(settings: ClusterSettings, say: Callable[[str], None]) -> ClusterStartOutcome:
    """Start the dir's cluster, or its missing nodes, and return once every node serves.

    Raises ConfigError (another node count, or a single broker in the dir), ToolMissingError,
    KafkaResolveError or BrokerStartError.
    """
    broker_dir = settings.broker_dir.resolve()
    if broker_status(broker_dir) is not None:
        raise ConfigError(f"a single broker runs from {broker_dir}: stop it first, or pass another --dir")
    java = require_tool("java", "openjdk-17-jre-headless")
    libs = resolve_kafka(settings.kafka_version, settings.cache_dir, say)
    recorded = cluster_status(broker_dir)
    if recorded is not None and recorded.running:
        if len(recorded.nodes) != settings.nodes:
            raise ConfigError(
                f"the cluster in {broker_dir} has {len(recorded.nodes)} nodes, not {settings.nodes}: "
                f"pass --nodes {len(recorded.nodes)}, or stop it first"
            )
        down = [node for node in recorded.nodes if not node.running]
        if not down:
            return ClusterStartOutcome(recorded, already_running=True, restarted=())
        return _bring_back(recorded, down, settings, java, libs, say)
    return _fresh(broker_dir, settings, java, libs, say)


def _fresh(broker_dir: Path, settings: ClusterSettings, java: str, libs: Path,
           say: Callable[[str], None]) -> ClusterStartOutcome:
    """Format and start a new cluster: new id, fresh logs, free ports."""
    broker_dir.mkdir(parents=True, exist_ok=True)
    ports: set[int] = set()
    while len(ports) < 2 * settings.nodes:
        ports.add(free_port())
    ordered = sorted(ports)
    ids = range(1, settings.nodes + 1)
    nodes = tuple(
        NodeState(node_id=i, pid=0, port=ordered[2 * (i - 1)], controller_port=ordered[2 * (i - 1) + 1],
                  node_dir=str(broker_dir / f"node-{i}"))
        for i in ids
    )
    voters = ",".join(f"{node.node_id}@{HOST}:{node.controller_port}" for node in nodes)
    archive, pending = class_sharing(settings.cache_dir, java)
    # The formatter only reads an archive: a dump is a broker's job, its class set the one to keep.
    tool_flags = TOOL_JVM_FLAGS if pending else (*TOOL_JVM_FLAGS, f"-XX:SharedArchiveFile={archive}")
    cluster_id = new_cluster_id()
    for node in nodes:
        node_dir = Path(node.node_dir)
        # The logs live as long as the cluster: a fresh format, so the recorded quorum is this one.
        shutil.rmtree(node_dir, ignore_errors=True)
        node_dir.mkdir(parents=True)
        properties = node_dir / "server.properties"
        properties.write_text(server_properties(
            node_id=node.node_id, nodes=settings.nodes, port=node.port, controller_port=node.controller_port,
            quorum=f"controller.quorum.voters={voters}", data_dir=node_dir / "data",
        ))
        (node_dir / "log4j2.properties").write_text(LOG4J_PROPERTIES)
        # A static quorum: the voters are in the properties, so the format takes no quorum flag.
        tool = java_command(java, "256m", tool_flags, node_dir / "log4j2.properties", libs)
        formatted = subprocess.run(
            [*tool, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(properties)],
            capture_output=True, text=True, check=False,
        )
        if formatted.returncode != 0:
            tail = last_lines(formatted.stdout + formatted.stderr, 5)
            raise BrokerStartError(f"formatting the KRaft log of node {node.node_id} in {node_dir} failed: "
                                   f"{tail}")
    state = ClusterState(cluster_id=cluster_id, kafka_version=settings.kafka_version, nodes=nodes,
                         class_archive_pending=str(pending) if pending else None)
    started = _launch(state, list(nodes), settings, java, libs, archive, pending, say)
    return ClusterStartOutcome(started, already_running=False, restarted=())


def _bring_back(state: ClusterState, down: list[NodeState], settings: ClusterSettings, java: str, libs: Path,
                say: Callable[[str], None]) -> ClusterStartOutcome:
    """Start the nodes that are down on their own data and ports; they rejoin and catch up."""
    archive, _ = class_sharing(settings.cache_dir, java)
    say(f"cluster {state.cluster_id}: starting node(s) {', '.join(str(node.node_id) for node in down)} "
        "again on their own data")
    started = _launch(state, down, settings, java, libs, archive, None, say)
    return ClusterStartOutcome(started, already_running=False, restarted=tuple(node.node_id for node in down))


def _launch(state: ClusterState, nodes: list[NodeState], settings: ClusterSettings, java: str, libs: Path,
            archive: Path, pending: Path | None, say: Callable[[str], None]) -> ClusterState:
    """Start `nodes` of `state`, record their pids, wait until the whole cluster serves."""
    broker_dir = settings.broker_dir.resolve()
    launched: list[tuple[subprocess.Popen[bytes], Path]] = []
    for node in nodes:
        node_dir = Path(node.node_dir)
        if pending is not None and node.node_id == 1:
            sharing = f"-XX:ArchiveClassesAtExit={pending}"  # one node dumps it, at its clean stop
        elif archive.exists():
            sharing = f"-XX:SharedArchiveFile={archive}"
        else:
            sharing = "-Xshare:auto"  # the JVM's default: no application archive yet
        jvm = java_command(java, settings.heap, (*BROKER_JVM_FLAGS, sharing), node_dir / "log4j2.properties",
                           libs)
        with node.log_path.open("ab") as log:
            process = subprocess.Popen(
                [*jvm, "kafka.Kafka", str(node_dir / "server.properties")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=node_dir,
                start_new_session=True,
            )
        launched.append((process, node.log_path))
        state = replace(state, nodes=tuple(replace(n, pid=process.pid) if n.node_id == node.node_id else n
                                           for n in state.nodes))
        say(f"node {node.node_id} pid {process.pid} starting on {HOST}:{node.port}, log {node.log_path}")
    state.write(broker_dir)
    deadline = time.monotonic() + settings.ready_timeout
    try:
        wait_ready(state.bootstrap, alive_check(launched, deadline), deadline, brokers=len(state.nodes))
    except BaseException:
        # Never leave half-started nodes behind, whatever interrupted the wait.
        _stop_all([process.pid for process, _ in launched], grace=5.0)
        if pending is not None:
            pending.unlink(missing_ok=True)  # a node that never got ready may have loaded few classes
        raise
    return state


def _stop_all(pids: list[int], grace: float) -> None:
    """TERM every pid at once (their controlled shutdowns overlap), then KILL whoever outlives `grace`."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # it died meanwhile: nothing to stop
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(pid_alive(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        if pid_alive(pid):
            kill_gracefully(pid, grace=0.0)


def stop_cluster(broker_dir: Path, grace: float = 30.0) -> ClusterState | None:
    """Stop every running node of the dir's cluster; returns what it was, or None if none ran.

    One node at a time, node 1 first (it may be the one dumping the class archive): a
    node's controlled shutdown needs a quorum of controllers, so each stops cleanly (TERM,
    KILL after `grace`) while a majority of voters is still up. The last nodes, left
    without a quorum, would wait for one forever: they get a short TERM, then KILL; the
    data they hold dies with the cluster anyway (the next start formats a fresh one).
    """
    broker_dir = broker_dir.resolve()
    state = cluster_status(broker_dir)
    if state is None:
        return None
    running = state.running
    majority = len(state.nodes) // 2 + 1
    for index, node in enumerate(running):
        alive = len(running) - index
        kill_gracefully(node.pid, grace if alive >= majority else QUORUMLESS_GRACE)
    if state.class_archive_pending is not None:
        publish_class_archive(Path(state.class_archive_pending))
    (broker_dir / CLUSTER_STATE_FILE).unlink(missing_ok=True)
    return state if running else None
