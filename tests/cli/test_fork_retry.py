"""`torpor fork --message-id M` retried: the retry names the fork the first try made
(helper-21's review of issue 20), against the real broker (no processor needed).

`--message-id` makes a retried fork a duplicate: the processor absorbs the second
control and only the first one's fork exists. Without `--as`, each run picked a new
random id, so the retry announced (and, waiting, gave the creation id of) a fork that
was never made. The retry's control must be the first one's, byte for byte in its body.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import wait_for_leaders
from tests.waiting import wait_until
from torpor.cli.fork import fork
from torpor.schemas.codec import decode_value
from torpor.schemas.records import Control, Input

pytestmark = pytest.mark.kafka


@pytest.fixture
def prefix(admin: AdminClient) -> Iterator[str]:
    name = f"test.forkretry.{uuid.uuid4().hex[:8]}."
    admin.create_topics([NewTopic(name + "inputs", num_partitions=3, replication_factor=1)])[
        name + "inputs"].result(timeout=30)
    # Else `torpor fork` may be told the topic does not exist (it was, on a loaded CI machine).
    wait_for_leaders(admin, name + "inputs", 3)
    yield name
    for future in admin.delete_topics([name + "inputs"], operation_timeout=30).values():
        future.result(timeout=60)


def _sent(kafka_bootstrap: str, topic: str, count: int) -> list[Input]:
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"t-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    found: list[Input] = []
    try:
        def read() -> bool:
            message = consumer.poll(1.0)
            value = message.value() if message is not None and message.error() is None else None
            if value is not None:
                found.append(decode_value(value, Input))
            return len(found) >= count
        wait_until(read, timeout=60, message=f"{count} records on {topic}")
    finally:
        consumer.close()
    return found


def test_a_retried_fork_with_the_same_message_id_names_the_same_new_thread(
        kafka_bootstrap: str, prefix: str) -> None:
    env = {"TORPOR_BOOTSTRAP": kafka_bootstrap, "TORPOR_TOPIC_PREFIX": prefix}
    args = ["agent-1", "--at", "2", "--message-id", "fork-try-1", "--operator", "ops", "--wait", "0"]
    said = []
    for _ in range(2):
        done = CliRunner().invoke(fork, args, env=env)
        assert done.exit_code == 0, done.output
        said.append(re.findall(r" as (\S+) \(message fork-try-1\)", done.output))
    assert said[0] == said[1] and len(said[0]) == 1, said
    first, second = _sent(kafka_bootstrap, prefix + "inputs", 2)
    assert first.message_id == second.message_id == "fork-try-1"
    assert isinstance(first.body, Control) and first.body == second.body
