"""Fixtures shared by every test: a real Kafka broker, an admin client, a topic per test.

`kafka_bootstrap` (session) finds a broker, in this order:

1. the address in TORPOR_TEST_BOOTSTRAP (what `bin/test` and `.ci/run` export);
2. a testcontainers Kafka container, when a Docker engine answers `docker info`;
3. otherwise the test fails, saying how to start a broker. It never skips: a test
   marked `kafka` that did not run is a test that did not pass.

`topic_factory(partitions=1, config=None)` creates a uniquely named topic, waits until
it has a leader on every partition, and deletes it after the test.

`own_broker` is a broker of the test's own (`tests.faults.own_broker`), in its temp
directory, closed after it: for a test that stops and restarts its broker.

A test marked `pure_only` replaces a module-level function of the compiled core
(`torpor.native.MODULES`), which compiled callers do not see: it is skipped while the
compiled core is in use, and `bin/test` runs it in its pure pass (`TORPOR_PURE=1`).

Every `torpor processor` a test starts is one process that folds (`TORPOR_PROCESSOR_WORKERS=1`,
set here for the session and inherited by the commands), as the tests that kill it,
stop it or read its store expect; without it the command would supervise a worker per
core. `tests/processors/test_processor_workers.py` runs the default and `--workers N`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Protocol

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._metadata import TopicMetadata  # not re-exported for a type checker
from confluent_kafka.cimpl import NewTopic

from tests.faults.own_broker import OwnBroker
from tests.waiting import wait_until
from torpor import native
from torpor.cli.workers import WORKERS_ENV

os.environ[WORKERS_ENV] = "1"  # the module docstring: a test's processor is one process

BOOTSTRAP_ENV: Final = "TORPOR_TEST_BOOTSTRAP"
HOW_TO_START: Final = (
    "start one with `export TORPOR_TEST_BOOTSTRAP=$(torpor broker start)` "
    "(stop it later with `torpor broker stop`), or run `bin/test`, which does both"
)
# The testcontainers image must be a cp-kafka one (its start script); 7.6 speaks KRaft.
CONTAINER_IMAGE: Final = "confluentinc/cp-kafka:7.6.0"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not native.active():
        return
    skip = pytest.mark.skip(reason="replaces a function of the compiled core: runs in bin/test's "
                                   f"pure pass ({native.PURE_ENV}=1)")
    for item in items:
        if item.get_closest_marker("pure_only") is not None:
            item.add_marker(skip)


class TopicFactory(Protocol):
    def __call__(self, partitions: int = 1, config: dict[str, str] | None = None) -> str: ...


def _reachable(bootstrap: str) -> str | None:
    """None if a broker answers metadata at `bootstrap`, else why not."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    try:
        if admin.list_topics(timeout=10).brokers:
            return None
        return "it answered with no brokers"
    except KafkaException as exc:
        return str(exc.args[0])


def _docker_answers() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=15, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The bootstrap address of a real Kafka broker (see the module docstring for the order)."""
    bootstrap = os.environ.get(BOOTSTRAP_ENV)
    if bootstrap:
        problem = _reachable(bootstrap)
        if problem is not None:
            pytest.fail(f"{BOOTSTRAP_ENV}={bootstrap} does not answer ({problem}): {HOW_TO_START}")
        yield bootstrap
        return
    if _docker_answers():
        from testcontainers.community.kafka import KafkaContainer

        container = (
            KafkaContainer(CONTAINER_IMAGE)
            .with_kraft()
            # One node: internal topics at replication factor 1, or transactions never start.
            .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
            .with_env("KAFKA_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS", "1000")
        )
        with container:
            yield str(container.get_bootstrap_server())
        return
    pytest.fail(f"no Kafka broker: {BOOTSTRAP_ENV} is unset and no Docker engine answers; {HOW_TO_START}")


@pytest.fixture(scope="session")
def admin(kafka_bootstrap: str) -> AdminClient:
    """An AdminClient on the test broker, shared by the session."""
    return AdminClient({"bootstrap.servers": kafka_bootstrap, "log_level": 2})


def is_led(topic: TopicMetadata | None, partitions: int | None = None) -> bool:
    """Whether a broker's metadata shows `topic` without an error and with a leader on each
    of its partitions (`partitions` of them, when given; at least one otherwise)."""
    if topic is None or topic.error is not None or not topic.partitions:
        return False
    if partitions is not None and len(topic.partitions) != partitions:
        return False
    return all(p.leader >= 0 for p in topic.partitions.values())


def wait_for_leaders(admin: AdminClient, name: str, partitions: int) -> None:
    """Wait until the broker's metadata shows `name` with a leader on each of its partitions.

    `create_topics(...).result()` returns once the controller made the topic; a client
    asking the broker for its metadata a moment later may still be told it does not exist.
    """
    wait_until(lambda: is_led(admin.list_topics(topic=name, timeout=5).topics.get(name), partitions),
               timeout=60, message=f"topic {name} has no leader on every partition")


@pytest.fixture
def topic_factory(admin: AdminClient, request: pytest.FixtureRequest) -> Iterator[TopicFactory]:
    """Create topics unique to this test; each is ready (leaders elected) when returned."""
    created: list[str] = []
    stem = re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name)[:120]

    def create(partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"test.{stem}.{uuid.uuid4().hex[:8]}"
        spec = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})
        admin.create_topics([spec])[name].result(timeout=30)
        created.append(name)
        wait_for_leaders(admin, name, partitions)
        return name

    yield create
    if created:
        for future in admin.delete_topics(created, operation_timeout=30).values():
            future.result(timeout=60)


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[OwnBroker]:
    """A broker of this test's own, in its temp directory; closed after the test."""
    broker = OwnBroker.start(tmp_path / "broker")
    yield broker
    broker.close()
