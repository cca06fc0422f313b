"""`streams/renewal.py`: a producer that fenced itself is renewed; a zombie's is not."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from tests.conftest import TopicFactory
from tests.waiting import wait_until
from torpor.schemas.errors import TorporError
from torpor.streams.deadline import Deadline
from torpor.streams.errors import translate
from torpor.streams.renewal import Membership, ProducerRenewal, is_own_expiry, may_rejoin
from torpor.streams.txncalls import RetriesExhaustedError, WatchdogExpiredError

EXPIRY = 10.0


def _fenced() -> TorporError:
    return translate(KafkaError(KafkaError._FENCED, "fenced", fatal=True), operation="abort_transaction")


def test_a_fence_of_a_transaction_older_than_its_timeout_is_the_producers_own_expiry() -> None:
    assert is_own_expiry(_fenced(), EXPIRY + 0.5, EXPIRY)


def test_a_fence_of_a_young_transaction_is_a_successors_and_is_not_renewed() -> None:
    assert not is_own_expiry(_fenced(), EXPIRY - 0.5, EXPIRY)
    assert not is_own_expiry(_fenced(), None, EXPIRY)


def test_a_hung_or_exhausted_call_leaves_the_producer_unknown_whatever_the_age() -> None:
    assert is_own_expiry(WatchdogExpiredError("hung"), None, EXPIRY)
    assert is_own_expiry(RetriesExhaustedError("kept failing"), 0.1, EXPIRY)


def test_a_fenced_consumer_is_rebuilt_only_when_no_other_live_member_holds_its_instance_id() -> None:
    assert may_rejoin(Membership.ABSENT)  # the member id that fenced it expired: nobody runs with our id
    assert may_rejoin(Membership.OURS)
    assert not may_rejoin(Membership.REPLACED)  # a successor: our new consumer would fence it
    assert not may_rejoin(Membership.UNKNOWN)


def _member(bootstrap: str, group: str, instance: str, topic: str, session_ms: int = 30_000) -> Consumer:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.instance.id": instance,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": session_ms, "log_level": 2})
    consumer.subscribe([topic])
    return consumer


def _joined(consumer: Consumer) -> str | None:
    consumer.poll(0.2)
    member_id: str | None = consumer.memberid()
    return member_id if consumer.assignment() and member_id else None


@pytest.fixture
def renewal(kafka_bootstrap: str, admin: AdminClient) -> Iterator[ProducerRenewal]:
    yield ProducerRenewal(lambda: Producer({"bootstrap.servers": kafka_bootstrap}), admin,
                          f"renewal-{uuid.uuid4().hex[:8]}", "p0", EXPIRY)


@pytest.mark.kafka
def test_the_group_says_whether_our_instance_id_is_still_ours_or_taken_over(
        kafka_bootstrap: str, topic_factory: TopicFactory, renewal: ProducerRenewal) -> None:
    topic = topic_factory()
    assert renewal.holder("nobody", Deadline.after(60)) is Membership.ABSENT
    first = _member(kafka_bootstrap, renewal.group_id, renewal.instance_id, topic)
    try:
        ours = wait_until(lambda: _joined(first), 60, "the first member joins")
        assert renewal.holder(ours, Deadline.after(60)) is Membership.OURS
        # A successor with the same instance id (and so the same transactional id) joins:
        # the first is now the zombie, and must not renew its producer.
        successor = _member(kafka_bootstrap, renewal.group_id, renewal.instance_id, topic)
        try:
            theirs = wait_until(lambda: _joined(successor), 60, "the successor joins")
            assert theirs != ours
            assert renewal.holder(ours, Deadline.after(60)) is Membership.REPLACED
            assert renewal.holder(theirs, Deadline.after(60)) is Membership.OURS
        finally:
            successor.close()
    finally:
        first.close()


@pytest.mark.kafka
def test_a_member_id_nobody_heartbeats_for_is_released_and_a_live_one_is_not(
        kafka_bootstrap: str, topic_factory: TopicFactory, renewal: ProducerRenewal) -> None:
    topic = topic_factory()
    # A lost JoinGroup of ours leaves a member id holding the instance id that nobody
    # heartbeats for: like a static member that closed (it does not leave the group).
    ghost = _member(kafka_bootstrap, renewal.group_id, renewal.instance_id, topic, session_ms=6_000)
    try:
        wait_until(lambda: _joined(ghost), 60, "the ghost joins")
    finally:
        ghost.close()
    assert renewal.holder("ours", Deadline.after(60)) is Membership.REPLACED
    assert renewal.released("ours", Deadline.after(120)) is Membership.ABSENT
    # A live member (librdkafka heartbeats for it in the background) keeps the id to the end.
    successor = _member(kafka_bootstrap, renewal.group_id, renewal.instance_id, topic, session_ms=6_000)
    try:
        wait_until(lambda: _joined(successor), 60, "the successor joins")
        assert renewal.released("ours", Deadline.after(15)) is Membership.REPLACED
    finally:
        successor.close()
