"""streams/clients.py: the factories, and check_reachable on a live and on a closed address."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

import torpor
from tests.conftest import TopicFactory
from tests.waiting import wait_until
from torpor.schemas.errors import ConfigError
from torpor.streams.admin import ensure_topics
from torpor.streams.clients import (
    check_reachable,
    make_admin,
    make_consumer,
    make_offsets_reader,
    make_producer,
)
from torpor.streams.config import KafkaSettings, Settings
from torpor.streams.deadline import Deadline
from torpor.streams.errors import BrokerUnreachableError


def closed_port() -> int:
    """A local TCP port nothing listens on: bound by us, then released."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def quiet(bootstrap: str) -> Settings:
    # log_level 0: librdkafka would print one "connection refused" line per retry.
    return Settings(
        kafka=KafkaSettings(bootstrap_servers=bootstrap, librdkafka_overrides=(("log_level", "0"),))
    )


def test_the_factories_build_clients_without_a_broker() -> None:
    settings = quiet("127.0.0.1:9")

    assert isinstance(make_producer(settings), Producer)
    assert isinstance(make_producer(settings, transactional_id="t"), Producer)
    consumer = make_consumer(settings, "group", instance_id="instance")
    assert isinstance(consumer, Consumer)
    consumer.close()
    assert isinstance(make_admin(settings), AdminClient)


def test_a_property_librdkafka_refuses_is_a_config_error_naming_it() -> None:
    settings = Settings(kafka=KafkaSettings(librdkafka_overrides=(("linger.msec", "5"),)))

    with pytest.raises(ConfigError, match=r"linger\.msec.*\[kafka\.librdkafka\]"):
        make_producer(settings)
    with pytest.raises(ConfigError, match=r"linger\.msec"):
        make_admin(settings)


def test_a_closed_port_is_unreachable_within_the_deadline_with_a_readable_message() -> None:
    bootstrap = f"127.0.0.1:{closed_port()}"
    settings = quiet(bootstrap)
    started = time.monotonic()

    with pytest.raises(BrokerUnreachableError) as caught:
        check_reachable(make_admin(settings), Deadline.after(1.5), bootstrap_servers=bootstrap)

    elapsed = time.monotonic() - started
    assert elapsed < 4.0, f"took {elapsed:.1f}s for a 1.5s deadline"
    message = str(caught.value)
    assert f"no Kafka broker answered at {bootstrap} within 1." in message
    assert "TORPOR_BOOTSTRAP" in message
    assert "`torpor broker start`" in message
    assert isinstance(caught.value, ConfigError)  # the caller refuses to start


def test_ensure_topics_against_a_closed_port_is_unreachable_too() -> None:
    bootstrap = f"127.0.0.1:{closed_port()}"
    settings = quiet(bootstrap)

    with pytest.raises(BrokerUnreachableError, match=bootstrap):
        ensure_topics(make_admin(settings), settings, Deadline.after(1.0))


def test_an_expired_deadline_does_not_call_the_broker_at_all() -> None:
    bootstrap = f"127.0.0.1:{closed_port()}"
    started = time.monotonic()

    with pytest.raises(BrokerUnreachableError, match=r"within 0\.0s"):
        check_reachable(make_admin(quiet(bootstrap)), Deadline.after(0), bootstrap_servers=bootstrap)

    assert time.monotonic() - started < 1.0


@pytest.mark.kafka
def test_a_live_broker_answers_with_its_metadata(kafka_bootstrap: str) -> None:
    metadata = check_reachable(
        make_admin(quiet(kafka_bootstrap)), Deadline.after(15), bootstrap_servers=kafka_bootstrap
    )

    assert metadata.brokers


@pytest.mark.kafka
def test_the_offsets_reader_reads_a_groups_commits_without_joining_it_or_waiting_on_a_pending_one(
        kafka_bootstrap: str, topic_factory: TopicFactory, admin: AdminClient) -> None:
    topic = topic_factory(partitions=1)
    group = f"test-offsets-reader-{uuid.uuid4().hex[:8]}"
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap))
    tp = TopicPartition(topic, 0)
    committer = make_consumer(settings, group)
    committer.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
    # An exactly-once processor's next offsets, sent in a transaction still open: pending.
    producer = make_producer(settings, transactional_id=f"test-offsets-reader-{uuid.uuid4().hex}")
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(topic, 0, 5)],
                                         committer.consumer_group_metadata(), 30)
    reader = make_offsets_reader(settings, group)
    try:
        (found,) = reader.committed([tp], timeout=30)  # read_committed would wait out its timeout
        assert (found.offset, found.error) == (2, None)
        producer.commit_transaction(30)
        wait_until(lambda: reader.committed([tp], timeout=30)[0].offset == 5, timeout=60,
                   message="the transaction's offset, once committed")
        (described,) = admin.describe_consumer_groups([group], request_timeout=30).values()
        assert described.result(timeout=30).members == []  # reading never joined the group
    finally:
        reader.close()
        committer.close()


def test_no_module_reads_a_groups_offsets_through_the_admin_client() -> None:
    """librdkafka#5040: the admin OffsetFetch crashes the process on NOT_COORDINATOR."""
    package = Path(torpor.__file__).parent
    callers = [str(path.relative_to(package)) for path in sorted(package.rglob("*.py"))
               if ".list_consumer_group_offsets(" in path.read_text()]
    assert callers == [], f"use clients.make_offsets_reader instead, in {callers}"
