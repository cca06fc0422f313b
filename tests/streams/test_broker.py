"""`torpor broker start|status|stop`, run as a user runs it: the console script, in a subprocess.

Starts a second broker in a temporary dir on its own port (the shared one is left
alone), so this needs Java and Maven, and the Kafka cache (fetched on first use).
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from tests.conftest import wait_for_leaders
from tests.waiting import wait_until
from torpor.streams import broker

pytestmark = pytest.mark.slow

ADDRESS = re.compile(r"^127\.0\.0\.1:\d+$")


def torpor(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "torpor"
    if not script.exists():
        pytest.fail(f"no console script at {script}: run `pip install -e '.[dev]'` in this venv")
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=240, check=False)


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


@pytest.fixture
def broker_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "broker"
    yield path
    torpor("broker", "stop", "--dir", str(path))  # whatever the test did, leave no broker behind


def produce_and_consume_one(bootstrap: str) -> None:
    topic = f"test.broker.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(timeout=30)
    wait_for_leaders(admin, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    producer.produce(topic, key=b"thread-1", value=b"hello")
    assert producer.flush(30) == 0, "the record was not delivered"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:

        def one_record() -> Message | None:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                return None
            return message

        message = wait_until(one_record, timeout=60, message=f"no record consumed from {topic}")
        assert (message.key(), message.value()) == (b"thread-1", b"hello")
    finally:
        consumer.close()


def test_start_status_stop_then_warm_restart_serves_records(broker_dir: Path) -> None:
    started = torpor("broker", "start", "--dir", str(broker_dir))
    assert started.returncode == 0, started.stderr
    bootstrap = last_line(started.stdout)
    assert ADDRESS.match(bootstrap), started.stdout
    # Ready means warmed up: the first transactional test does not create these.
    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    assert {"__transaction_state", "__consumer_offsets"} <= set(topics)

    status = torpor("broker", "status", "--dir", str(broker_dir))
    assert status.returncode == 0
    assert "running" in status.stdout and bootstrap in status.stdout

    again = torpor("broker", "start", "--dir", str(broker_dir))
    assert again.returncode == 0
    assert last_line(again.stdout) == bootstrap
    assert "already running" in again.stderr

    stopped = torpor("broker", "stop", "--dir", str(broker_dir))
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    after = torpor("broker", "status", "--dir", str(broker_dir))
    assert after.returncode == 3 and "stopped" in after.stdout

    restarted = torpor("broker", "start", "--dir", str(broker_dir))
    assert restarted.returncode == 0, restarted.stderr
    produce_and_consume_one(last_line(restarted.stdout))

    assert torpor("broker", "stop", "--dir", str(broker_dir)).returncode == 0
    assert torpor("broker", "status", "--dir", str(broker_dir)).returncode == 3


def test_start_on_a_taken_port_fails_in_one_line_naming_the_remedy(broker_dir: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = torpor("broker", "start", "--dir", str(broker_dir), "--port", str(port))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"port {port}" in last_line(result.stderr) and "--port" in last_line(result.stderr)


def test_cluster_ids_never_start_with_a_dash_which_the_storage_tool_reads_as_an_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 0xfb << 2 encodes to "-" as the first url-safe base64 character: the first draw is rejected.
    draws = iter([uuid.UUID(bytes=b"\xfb" + bytes(15)), uuid.UUID(int=1)])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))
    assert broker.new_cluster_id() == "AAAAAAAAAAAAAAAAAAAAAQ"
