"""`torpor.streams.cluster` without starting a JVM: the nodes' properties, the settings, the state file.

Starting, degrading and restoring a real three-node cluster is `tests/faults/test_cluster.py`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torpor.schemas.errors import ConfigError
from torpor.streams.broker import server_properties
from torpor.streams.cluster import (
    CLUSTER_STATE_FILE,
    ClusterSettings,
    ClusterState,
    NodeState,
    cluster_status,
)


def properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def test_a_three_node_cluster_replicates_everything_three_times_with_two_in_sync(tmp_path: Path) -> None:
    voters = "1@127.0.0.1:9001,2@127.0.0.1:9002,3@127.0.0.1:9003"
    node = properties(server_properties(node_id=2, nodes=3, port=9102, controller_port=9002,
                                        quorum=f"controller.quorum.voters={voters}", data_dir=tmp_path))

    assert node["node.id"] == "2" and node["process.roles"] == "broker,controller"
    assert node["controller.quorum.voters"] == voters
    assert node["listeners"] == "PLAINTEXT://127.0.0.1:9102,CONTROLLER://127.0.0.1:9002"
    assert node["auto.create.topics.enable"] == "false"
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor",
                "share.coordinator.state.topic.replication.factor"):
        assert node[key] == "3", key
    for key in ("min.insync.replicas", "transaction.state.log.min.isr",
                "share.coordinator.state.topic.min.isr"):
        assert node[key] == "2", key


def test_a_single_node_keeps_one_copy(tmp_path: Path) -> None:
    node = properties(server_properties(node_id=1, nodes=1, port=9102, controller_port=9002,
                                        quorum="controller.quorum.bootstrap.servers=127.0.0.1:9002",
                                        data_dir=tmp_path))

    assert (node["default.replication.factor"], node["min.insync.replicas"]) == ("1", "1")
    transactions = (node["transaction.state.log.replication.factor"], node["transaction.state.log.min.isr"])
    assert transactions == ("1", "1")


@pytest.mark.parametrize("nodes", [0, 2, 10])
def test_a_cluster_has_three_to_nine_nodes(tmp_path: Path, nodes: int) -> None:
    with pytest.raises(ConfigError, match="--nodes"):
        ClusterSettings(broker_dir=tmp_path, cache_dir=tmp_path, nodes=nodes)


def test_the_state_file_round_trips_and_names_every_node_in_the_bootstrap(tmp_path: Path) -> None:
    nodes = tuple(NodeState(node_id=i, pid=0, port=9100 + i, controller_port=9000 + i,
                            node_dir=str(tmp_path / f"node-{i}")) for i in (1, 2, 3))
    state = ClusterState(cluster_id="abc", kafka_version="4.4.0", nodes=nodes)
    state.write(tmp_path)

    assert cluster_status(tmp_path) == state
    assert state.bootstrap == "127.0.0.1:9101,127.0.0.1:9102,127.0.0.1:9103"
    assert state.running == ()  # pid 0 is no node's JVM
    (tmp_path / CLUSTER_STATE_FILE).write_text("{not json")
    assert cluster_status(tmp_path) is None


def test_the_command_refuses_two_nodes_and_a_port_for_a_cluster_in_one_line(tmp_path: Path) -> None:
    script = str(Path(sys.executable).parent / "torpor")
    for extra in (["--nodes", "2"], ["--nodes", "3", "--port", "9092"]):
        result = subprocess.run([script, "broker", "start", "--dir", str(tmp_path), *extra],
                                capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 1, result
        assert "Traceback" not in result.stderr
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
