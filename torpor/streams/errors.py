"""The errors of the Kafka plumbing, and `translate`: no raw `KafkaException` leaves `torpor.streams`.

Every failure of a confluent-kafka call is classified here by what the caller must do,
under the root tree of `torpor.schemas.errors`::

    TorporError
    ├── ConfigError                         refuse to start
    │   ├── BrokerUnreachableError          no broker answered at the bootstrap address in time
    │   └── TopicLayoutError                the topics exist but are laid out wrongly
    ├── RetriableError
    │   └── KafkaRetriableError             retriable Kafka error: retry the call within its deadline
    ├── CheckpointAbortedError
    │   └── TransactionAbortRequiredError   abort the transaction, drop the overlay, seek back
    ├── FencedError
    │   ├── ProducerFencedError             fatal or fenced: another instance owns the id, exit
    │   └── ConsumerFencedError             the consumer lost its static membership: rejoin or exit
    └── KafkaOperationError                 any other Kafka error, with its code and description

`translate(exc)` picks the class from the `KafkaError` flags and code, in this order,
because librdkafka may set more than one flag and the strongest remedy must win:

1. FENCED_INSTANCE_ID (the group's answer to our consumer, or to offsets our producer
   sent with its metadata) -> `ConsumerFencedError`; then fatal, or another fencing code
   (`_FENCED`, `PRODUCER_FENCED`, `INVALID_PRODUCER_EPOCH`, ...) -> `ProducerFencedError`:
   the producer is unusable; retrying or aborting cannot help.
2. `txn_requires_abort()` -> `TransactionAbortRequiredError`.
3. `retriable()` -> `KafkaRetriableError`.
4. anything else -> `KafkaOperationError`.

Two calls say more than their flags, and have translators of their own:
`translate_produce` (a `_STATE` refusal inside an open transaction means the transaction
failed under it: abort) and `translate_consume` (a consumer's fatal error is the loss of
its static membership: `ConsumerFencedError`).

Why `BrokerUnreachableError` is a `ConfigError` and not a `RetriableError`: it is raised
only after the caller's whole deadline has passed without an answer, so there is no
budget left to retry in. At that point the caller refuses to start, and the operator
either fixes the bootstrap address or starts the broker. A broker lost while running is
different: librdkafka reconnects by itself, and its errors arrive through `translate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from confluent_kafka import KafkaError, KafkaException

from torpor.schemas.errors import (
    CheckpointAbortedError,
    ConfigError,
    FencedError,
    RetriableError,
    TorporError,
)

# Codes that mean "another producer instance owns this transactional id now", whether or
# not librdkafka raised them as fatal. The only remedy is to exit and let the new owner run.
FENCING_CODES: Final[frozenset[int]] = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTION_COORDINATOR_FENCED,
        KafkaError.FENCED_INSTANCE_ID,
    }
)


@dataclass(frozen=True, slots=True)
class KafkaErrorDetail:
    """What librdkafka said: the numeric code, its symbolic name and the description."""

    code: int
    name: str
    description: str

    @classmethod
    def of(cls, error: KafkaError) -> KafkaErrorDetail:
        return cls(code=error.code(), name=error.name(), description=error.str())

    def __str__(self) -> str:
        return f"{self.name} (code {self.code}): {self.description}"


class BrokerUnreachableError(ConfigError):
    """No broker answered at the bootstrap address before the deadline.

    The message names the address and what to do: check it, or start a local broker
    with `torpor broker start`.
    """

    def __init__(self, bootstrap_servers: str, waited_seconds: float, cause: str | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.waited_seconds = waited_seconds
        because = f" ({cause})" if cause else ""
        super().__init__(
            f"no Kafka broker answered at {bootstrap_servers} within {waited_seconds:.1f}s{because}. "
            "Check TORPOR_BOOTSTRAP (or [kafka] bootstrap_servers in the config file), "
            "or start a local broker with `torpor broker start`."
        )


class TopicLayoutError(ConfigError):
    """The Torpor topics exist but break an invariant (partition counts, compaction).

    The message says which topic is wrong, why it matters and the command that fixes it.
    """


class _FromKafka(TorporError):
    """Mixin: an error translated from librdkafka, which keeps the original detail."""

    def __init__(self, message: str, detail: KafkaErrorDetail) -> None:
        super().__init__(message)
        self.detail = detail


class ProducerFencedError(_FromKafka, FencedError):
    """Fatal or fenced: a newer instance owns this transactional id. Exit; do not retry."""


class TransactionAbortRequiredError(_FromKafka, CheckpointAbortedError):
    """The open transaction cannot commit: abort it, drop the overlay, seek back."""


class ConsumerFencedError(_FromKafka, FencedError):
    """The consumer's `group.instance.id` went to another member id: the consumer is unusable.

    librdkafka makes FENCED_INSTANCE_ID fatal for the consumer (its only fatal error in
    the classic group protocol). A successor with this instance id, or a JoinGroup of our
    own whose answer was lost in a coordinator failover, holds the id now; the loop asks the
    group which (`renewal.ProducerRenewal.holder`) and rebuilds its consumer or exits.
    """


class KafkaRetriableError(_FromKafka, RetriableError):
    """A transient Kafka failure: retry the same call while its deadline allows."""


class KafkaOperationError(_FromKafka):
    """A Kafka error with no better classification; the message carries its code."""


def translate(exc: KafkaException | KafkaError, *, operation: str = "kafka call") -> TorporError:
    """Classify a confluent-kafka failure by what the caller must do (see the module docstring).

    `operation` names the call that failed (e.g. "commit_transaction"), so the message
    reads as "<operation> failed: <NAME> (code N): <description>. <what to do>".
    Returns the error; the caller raises it `from exc`, keeping the original as the cause.
    """
    error = kafka_error_of(exc)
    detail = KafkaErrorDetail.of(error)
    head = f"{operation} failed: {detail}"
    if error.code() == KafkaError.FENCED_INSTANCE_ID:
        return _consumer_fenced(head, detail)
    if error.fatal() or error.code() in FENCING_CODES:
        return ProducerFencedError(
            f"{head}. The client is fenced or fatally failed (another instance likely took over its "
            "transactional.id or group.instance.id): exit and let the new owner run; do not retry.",
            detail,
        )
    if error.txn_requires_abort():
        return TransactionAbortRequiredError(
            f"{head}. Abort the transaction, drop the overlay and seek back to the committed offsets.",
            detail,
        )
    if error.retriable():
        return KafkaRetriableError(f"{head}. Retriable: retry within the deadline.", detail)
    return KafkaOperationError(head, detail)


def translate_produce(exc: KafkaException, *, topic: str) -> TorporError:
    """Classify a failed `produce` inside an open transaction.

    librdkafka refuses a record with `_STATE` when the transaction no longer accepts any
    (rdkafka_msg.c, `rd_kafka_check_produce`; a fatal producer gets `_FATAL` instead). In a
    checkpoint that began, that means the transaction failed in the background with an
    abortable error: OUT_OF_ORDER_SEQUENCE_NUMBER after a leader failover, seen in the
    three-node kill test, fails it so (`TXNERR ... requires epoch bump`). The remedy is
    librdkafka's for any abortable error: `abort_transaction`, which also bumps the epoch
    when the error requires it (KIP-360). Any other failure is `translate`'s.
    """
    error = kafka_error_of(exc)
    if error.code() == KafkaError._STATE:
        return TransactionAbortRequiredError(
            f"produce to {topic} failed: {KafkaErrorDetail.of(error)}. The open transaction failed "
            "(an abortable error, see the client log's TXNERR line): abort it, drop the overlay and "
            "seek back to the committed offsets.",
            KafkaErrorDetail.of(error),
        )
    return translate(exc, operation=f"produce to {topic}")


def translate_consume(error: KafkaError) -> TorporError:
    """Classify an error the consumer returned from `consume()`.

    A fatal consumer error (`_FATAL`, or the FENCED_INSTANCE_ID it stands for) is the loss
    of the static membership: `ConsumerFencedError`. Any other is `translate`'s.
    """
    if error.fatal() or error.code() in (KafkaError._FATAL, KafkaError.FENCED_INSTANCE_ID):
        detail = KafkaErrorDetail.of(error)
        return _consumer_fenced(f"consume failed: {detail}", detail)
    return translate(error, operation="consume")


def _consumer_fenced(head: str, detail: KafkaErrorDetail) -> ConsumerFencedError:
    return ConsumerFencedError(
        f"{head}. The consumer lost its group.instance.id to another member id and is unusable: "
        "rebuild it if no live member holds the id, else exit.",
        detail,
    )


def kafka_error_of(exc: KafkaException | KafkaError) -> KafkaError:
    """The `KafkaError` inside `exc`; a KafkaException raised with a bare string becomes `_FAIL`."""
    if isinstance(exc, KafkaError):
        return exc
    first = exc.args[0] if exc.args else None
    if isinstance(first, KafkaError):
        return first
    return KafkaError(KafkaError._FAIL, str(first) if first is not None else repr(exc))



# Local errors of a read that a failover causes and that librdkafka does not flag
# retriable. Each was seen in the three-node kill test (tests/faults/test_cluster.py)
# while the dead node's partitions had no leader yet: the call ran out its own timeout,
# the dead broker's handle it was queued on went away (`_DESTROY_BROKER`), the client's
# metadata had no leader for the partition (`_UNKNOWN_PARTITION`); and their kin (no
# broker answering, the metadata or coordinator being refreshed). A topic or partition
# that is really missing surfaces at the caller's deadline instead of at once.
_TRANSIENT_READ_CODES: Final[frozenset[int]] = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._DESTROY_BROKER,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._WAIT_COORD,
        KafkaError._NODE_UPDATE,
    }
)


def is_transient_read_error(exc: KafkaException) -> bool:
    """Whether a read (watermarks, committed offsets) failed only for a moment.

    During a leader or coordinator failover (about ten seconds) a read capped at a few
    seconds times out, or loses the broker it was sent to. A read is safe to repeat, so
    its caller retries it, after a pause, while its own deadline lasts.
    """
    return kafka_error_of(exc).code() in _TRANSIENT_READ_CODES


# Delivery failures that pass: librdkafka gave up on a record after `message.timeout.ms`
# (5 minutes by default) because the broker, or the partition's leader, was away all that
# time. Not a purge (the producer closing) and not a refusal (authorization, a record too
# large, a fatal idempotence error): sending the same bytes again cannot change those.
_TRANSIENT_DELIVERY_CODES: Final[frozenset[int]] = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    }
)


def is_transient_delivery_error(error: KafkaError) -> bool:
    """Whether a delivery report's `error` says only that no broker took the record in time,
    so that producing the same record again (an idempotent send of a record its consumer
    dedups: a completion, a tool's answer) may well succeed once the broker is back."""
    return error.code() in _TRANSIENT_DELIVERY_CODES

