"""Factories for the confluent-kafka clients, and the reachability check.

Contract: every client Torpor makes is built here from the dicts of `streams.config`, so
no other module assembles librdkafka configuration. A configuration librdkafka refuses
(an unknown or invalid `[kafka.librdkafka]` property) raises `ConfigError`, never a raw
`KafkaException`. `check_reachable` bounds the first contact with the cluster by a
`Deadline` and turns silence into `BrokerUnreachableError`.

The clients returned are confluent-kafka's own: their calls can still raise
`KafkaException`, and the modules of `torpor.streams` that call them translate with
`streams.errors.translate`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Final, NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._metadata import ClusterMetadata  # the public name is not re-exported for typing

from torpor.schemas.errors import ConfigError
from torpor.streams.config import Settings, admin_config, consumer_config, producer_config
from torpor.streams.deadline import Deadline
from torpor.streams.errors import BrokerUnreachableError, kafka_error_of, translate
from torpor.streams.kafkalog import KAFKA_LOG

# One metadata request waits at most this long, so that a broker still starting up (or a
# first connection refused) is retried within the caller's deadline instead of once.
REACHABILITY_CALL_SECONDS: Final = 5.0
_RETRY_PAUSE: Final = 0.1

OnCommit = Callable[[KafkaError | None, list[TopicPartition]], None]
"""librdkafka's `on_commit` callback: the error of the whole commit (None: none), and each
partition with its committed offset or its own `error`."""

# What librdkafka reports when no broker answered: keep trying until the deadline.
_NO_ANSWER: Final[frozenset[int]] = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.NETWORK_EXCEPTION,
    }
)
# Refusals that no amount of waiting fixes: the credentials or protocol are wrong.
_REFUSED: Final[frozenset[int]] = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._SSL,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)


def make_producer(settings: Settings, transactional_id: str | None = None, *,
                  linger_ms: int | None = None) -> Producer:
    """A producer (transactional when `transactional_id` is given); see `config.producer_config`.

    The caller still runs `init_transactions` itself, under its own deadline.
    """
    conf = producer_config(settings, transactional_id=transactional_id, linger_ms=linger_ms)
    try:
        return Producer({**conf, "logger": KAFKA_LOG})
    except KafkaException as exc:
        raise _refused(exc) from exc


def make_consumer(settings: Settings, group_id: str, instance_id: str | None = None,
                  on_commit: OnCommit | None = None) -> Consumer:
    """A read_committed, manually committing consumer; see `config.consumer_config`.

    `on_commit` receives the broker's answer to every commit (asynchronous ones included),
    from within the consumer's `consume()`, `poll()` or `close()`.
    """
    conf: dict[str, object] = {**consumer_config(settings, group_id, instance_id=instance_id)}
    if on_commit is not None:
        conf["on_commit"] = on_commit
    return _consumer(conf)


def make_offsets_reader(settings: Settings, group_id: str) -> Consumer:
    """A consumer that only reads `group_id`'s committed offsets (`committed()`).

    It never subscribes, so it never joins the group, and never commits. This, not the
    admin client's `list_consumer_group_offsets`, is how to read another group's offsets:
    librdkafka (up to 2.16 at least, confluentinc/librdkafka#5040) answers an admin
    OffsetFetch that the broker refuses with NOT_COORDINATOR (a coordinator that moved or
    is still loading, as after a broker restart) by dereferencing the admin client's
    consumer group, which it has none of: the whole process dies of SIGSEGV. A consumer
    has that group and asks for the new coordinator. read_uncommitted, because librdkafka
    asks for stable offsets (KIP-447) under read_committed, and the pending offsets of an
    exactly-once processor would hold every read until its timeout.
    """
    return _consumer({**consumer_config(settings, group_id), "isolation.level": "read_uncommitted"})


def _consumer(conf: dict[str, object]) -> Consumer:
    try:
        return Consumer({**conf, "logger": KAFKA_LOG})
    except KafkaException as exc:
        raise _refused(exc) from exc


def make_admin(settings: Settings) -> AdminClient:
    """An admin client for the configured cluster; see `config.admin_config`."""
    conf: dict[str, object] = {**admin_config(settings), "logger": KAFKA_LOG}
    try:
        return AdminClient(conf)  # type: ignore[arg-type]  # the stub omits `logger`, which it takes
    except KafkaException as exc:
        raise _refused(exc) from exc


def _refused(exc: KafkaException) -> ConfigError:
    """librdkafka rejected a configuration dict: only `[kafka.librdkafka]` can have caused it."""
    return ConfigError(
        f"librdkafka refused the client configuration: {translate(exc, operation='client setup')}. "
        "Check the [kafka.librdkafka] properties in the config file."
    )


def check_reachable(admin: AdminClient, deadline: Deadline, *, bootstrap_servers: str) -> ClusterMetadata:
    """Return the cluster metadata once a broker answers, trying until `deadline`.

    Raises `BrokerUnreachableError` (naming `bootstrap_servers`, which the caller passes
    because a client does not expose its configuration) when no broker answered in time,
    `ConfigError` when the cluster refused the credentials, and a translated error for
    anything else.
    """
    started = deadline.clock()
    last_failure: str | None = None
    while not deadline.expired():
        try:
            return admin.list_topics(timeout=deadline.timeout_for_call(REACHABILITY_CALL_SECONDS))
        except KafkaException as exc:
            error = kafka_error_of(exc)
            code = error.code()
            if code in _REFUSED:
                raise ConfigError(
                    f"the cluster at {bootstrap_servers} refused the connection: {translate(exc)}. "
                    "Check TORPOR_SECURITY_PROTOCOL, TORPOR_SASL_MECHANISM, TORPOR_SASL_USERNAME "
                    "and TORPOR_SASL_PASSWORD."
                ) from exc
            if code not in _NO_ANSWER:
                raise translate(exc, operation="list_topics") from exc
            last_failure = error.str()
            # A refused connection can fail faster than the call's timeout: pause, don't spin.
            time.sleep(min(_RETRY_PAUSE, deadline.remaining()))
    raise BrokerUnreachableError(bootstrap_servers, deadline.clock() - started, last_failure)


Headers = list[tuple[str, str | bytes | None]] | None
"""Record headers as `Producer.produce` takes them."""


class SentRecord(NamedTuple):
    """A record as a delivery report gives it back: what producing it again needs."""

    topic: str
    key: bytes
    value: bytes
    partition: int
    headers: Headers


def sent_record(message: Message) -> SentRecord | None:
    """The record the delivery report `message` speaks of, to produce again (the same bytes,
    partition and headers), or None if the report lacks its topic, value or partition."""
    topic, value, partition = message.topic(), message.value(), message.partition()
    if topic is None or value is None or partition is None:
        return None
    found = message.headers()  # a traced record carries its trace context there
    headers: Headers = list(found.items()) if isinstance(found, dict) else found
    return SentRecord(topic, message.key() or b"", value, partition, headers)


OnDelivery = Callable[[KafkaError | None, Message], None]
"""A delivery report's callback, as `Producer.produce` takes it."""


def produce_again(producer: Producer, queued: deque[tuple[SentRecord, OnDelivery]]) -> None:
    """Produce the `queued` records in order (each with its callback), each dropped from the
    queue once produced; a full producer queue (`BufferError`) leaves the rest for the next call.

    For records a delivery report gave back to be sent again (`sent_record`): the report only
    queues them, and this runs outside it. From inside a report, the `poll` or `flush` a full
    queue needs makes confluent-kafka's client abort the process (it serves callbacks within a
    callback it is serving), and the queue cannot make room while that report runs."""
    while queued:
        record, on_delivery = queued[0]
        try:
            producer.produce(record.topic, value=record.value, key=record.key, partition=record.partition,
                             headers=record.headers, on_delivery=on_delivery)
        except BufferError:
            return
        queued.popleft()

