"""streams/errors.py: translate classifies each KafkaError by what the caller must do.

The errors are real `KafkaError` values, built the way librdkafka builds them (code plus
flags); the broker-side cases (a fenced producer) are in test_transactions.py.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from torpor.schemas.errors import (
    CheckpointAbortedError,
    ConfigError,
    FencedError,
    RetriableError,
    TorporError,
)
from torpor.streams.errors import (
    FENCING_CODES,
    BrokerUnreachableError,
    ConsumerFencedError,
    KafkaOperationError,
    KafkaRetriableError,
    ProducerFencedError,
    TransactionAbortRequiredError,
    is_transient_delivery_error,
    is_transient_read_error,
    translate,
    translate_consume,
    translate_produce,
)


def test_a_fatal_error_is_fenced_whatever_else_it_says() -> None:
    error = KafkaError(KafkaError._FATAL, "fatal", fatal=True, retriable=True, txn_requires_abort=True)

    translated = translate(KafkaException(error), operation="commit_transaction")

    assert isinstance(translated, ProducerFencedError)
    assert isinstance(translated, FencedError)
    assert str(translated).startswith("commit_transaction failed: _FATAL (code -150): fatal.")
    assert translated.detail.code == KafkaError._FATAL


@pytest.mark.parametrize("code", sorted(FENCING_CODES))
def test_every_fencing_code_is_fenced_even_when_not_flagged_fatal(code: int) -> None:
    assert isinstance(translate(KafkaError(code)), FencedError)


def test_an_abortable_error_asks_for_an_abort_before_a_retry() -> None:
    error = KafkaError(KafkaError._STATE, "abortable", retriable=True, txn_requires_abort=True)

    translated = translate(KafkaException(error))

    assert isinstance(translated, TransactionAbortRequiredError)
    assert isinstance(translated, CheckpointAbortedError)
    assert "Abort the transaction" in str(translated)


def test_a_retriable_error_is_retriable() -> None:
    translated = translate(KafkaError(KafkaError.REQUEST_TIMED_OUT, "slow", retriable=True))

    assert isinstance(translated, KafkaRetriableError)
    assert isinstance(translated, RetriableError)


def test_anything_else_keeps_its_code_and_description() -> None:
    translated = translate(
        KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too big")), operation="produce"
    )

    assert type(translated) is KafkaOperationError
    assert isinstance(translated, TorporError)
    assert translated.detail.name == "MSG_SIZE_TOO_LARGE"
    assert (
        str(translated)
        == f"produce failed: MSG_SIZE_TOO_LARGE (code {KafkaError.MSG_SIZE_TOO_LARGE}): too big"
    )


def test_a_kafka_exception_without_an_error_inside_becomes_a_plain_failure() -> None:
    translated = translate(KafkaException("something odd"))

    assert type(translated) is KafkaOperationError
    assert translated.detail.name == "_FAIL"
    assert "something odd" in str(translated)


def test_an_unreachable_broker_means_refuse_to_start() -> None:
    error = BrokerUnreachableError("kafka-1:9092", 2.5, "Broker transport failure")

    assert isinstance(error, ConfigError)
    assert str(error).startswith(
        "no Kafka broker answered at kafka-1:9092 within 2.5s (Broker transport failure)."
    )
    assert "`torpor broker start`" in str(error)


def test_a_read_that_lost_its_leader_for_a_moment_is_transient_and_a_refused_one_is_not() -> None:
    for code in (KafkaError._TIMED_OUT, KafkaError._DESTROY_BROKER, KafkaError._UNKNOWN_PARTITION):
        assert is_transient_read_error(KafkaException(KafkaError(code))), code
    for code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError._INVALID_ARG, KafkaError._FENCED):
        assert not is_transient_read_error(KafkaException(KafkaError(code))), code


def test_a_produce_refused_in_a_failed_transaction_asks_for_an_abort() -> None:
    # librdkafka's _STATE from produce: the transaction failed under it (an abortable error).
    state = KafkaException(KafkaError(KafkaError._STATE, "Erroneous state"))
    refused = translate_produce(state, topic="t.out")

    assert isinstance(refused, TransactionAbortRequiredError)
    assert str(refused).startswith("produce to t.out failed: _STATE (code -172): Erroneous state.")


def test_a_produce_refused_for_another_reason_keeps_its_plain_translation() -> None:
    fatal = KafkaException(KafkaError(KafkaError._FATAL, "fenced earlier", fatal=True))
    too_large = KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))

    assert isinstance(translate_produce(fatal, topic="t.out"), ProducerFencedError)
    assert type(translate_produce(too_large, topic="t.out")) is KafkaOperationError


def test_a_consumer_that_lost_its_static_membership_is_fenced_as_a_consumer() -> None:
    # librdkafka hands the application _FATAL for FENCED_INSTANCE_ID (rd_kafka_set_fatal_error).
    for error in (KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced"),
                  KafkaError(KafkaError.FENCED_INSTANCE_ID, "fenced", fatal=True)):
        fenced = translate_consume(error)
        assert isinstance(fenced, ConsumerFencedError) and isinstance(fenced, FencedError), error
        assert not isinstance(fenced, ProducerFencedError)


def test_a_consumer_error_other_than_a_fence_keeps_its_plain_translation() -> None:
    translated = translate_consume(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"))

    assert type(translated) is KafkaOperationError
    assert str(translated).startswith("consume failed: TOPIC_AUTHORIZATION_FAILED")


@pytest.mark.parametrize(("code", "again"), [
    (KafkaError._MSG_TIMED_OUT, True),  # no broker took it within message.timeout.ms
    (KafkaError._TRANSPORT, True),
    (KafkaError.NOT_LEADER_FOR_PARTITION, True),
    (KafkaError._PURGE_QUEUE, False),  # the producer is closing
    (KafkaError._PURGE_INFLIGHT, False),
    (KafkaError.MSG_SIZE_TOO_LARGE, False),  # the same bytes would be refused again
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, False),
    (KafkaError._FATAL, False),
])
def test_only_a_delivery_that_timed_out_or_lost_its_broker_is_worth_sending_again(code: int,
                                                                                   again: bool) -> None:
    assert is_transient_delivery_error(KafkaError(code)) is again
