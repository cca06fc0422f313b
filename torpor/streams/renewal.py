"""Renewing a fenced producer in-process, and telling that case from a genuine zombie.

A leader failover (a broker killed: about ten seconds of a 9 s session timeout and an
election) can outlast `transaction.timeout.ms`. The transaction coordinator then aborts
the open transaction and bumps the producer's epoch, and the producer's next call ends
`_FENCED` or `INVALID_TXN_STATE` (fatal), or hangs past the watchdog. Nobody else owns the
transactional id: the instance fenced itself by being slow. Kafka Streams closes its tasks
dirty and carries on with a new producer; so does the loop (`CheckpointLoop._renew`), when
`is_own_expiry` and `holder` say it may:

- `is_own_expiry(error, age, expiry)`: the call hung (the producer's state is unknown,
  which a new producer's `init_transactions` settles), or the transaction had been open
  at least `transaction.timeout.ms`, so the coordinator may have aborted it on its own.
  A fence of a younger transaction can only come from another producer's
  `init_transactions` with this id: a genuine zombie-fencing.
- `ProducerRenewal.holder(member_id)`: the transactional id derives from the static group
  instance id (`<app>-<instance>`), so a successor with our transactional id also joined
  the group with our `group.instance.id`, and holds it under another member id. Then this
  instance is the zombie (`Membership.REPLACED`): it must exit, since its new producer's
  `init_transactions` would fence the successor. A paused process (SIGSTOP, a frozen VM)
  passes the age test; this one stops it.

When either test fails, or the group cannot be asked in time, the loop exits as before and
a restart settles the transaction.

The consumer can lose its static membership in a failover too. librdkafka makes
FENCED_INSTANCE_ID fatal for the consumer (`errors.ConsumerFencedError`): another member
id holds our `group.instance.id`. That is a successor (then we are the zombie), or a
JoinGroup of our own whose answer was lost while the group coordinator moved, which holds
the id until its session times out (nobody heartbeats for it). `ProducerRenewal.released`
waits, at most `rejoin_wait`, for the holder to be anything but another live member, and
`may_rejoin` decides: nobody (`ABSENT`) or our own member id (`OURS`) lets the loop build a
new consumer with the same instance id in-process; a holder still there at the end
(`REPLACED`), or no answer (`UNKNOWN`), makes it exit. A successor heartbeats, so it stays.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from torpor.schemas.errors import TorporError
from torpor.streams.deadline import Deadline
from torpor.streams.errors import translate
from torpor.streams.txncalls import RetriesExhaustedError, WatchdogExpiredError, backoff

log: Final = logging.getLogger(__name__)

# How long one describe of the group may take; the group coordinator may be moving too.
_DESCRIBE_TIMEOUT_S: Final = 10.0


class Membership(enum.Enum):
    """Who holds this instance's `group.instance.id` in the group, as its coordinator says."""

    OURS = "ours"  # our consumer's member id: nobody took over
    ABSENT = "absent"  # nobody (our membership expired): no successor with our id either
    REPLACED = "replaced"  # another member id: a successor with our transactional id runs
    UNKNOWN = "unknown"  # the coordinator did not answer in time: assume the worst


def may_rejoin(holder: Membership) -> bool:
    """Whether a fenced consumer may be rebuilt with the same `group.instance.id`.

    Only when no other live member holds the id: our new consumer would fence a successor's.
    """
    return holder in (Membership.ABSENT, Membership.OURS)


def is_own_expiry(error: TorporError, transaction_age: float | None, expiry: float) -> bool:
    """Whether `error` may come from this producer's own slowness, not from a successor.

    True for a hung call (`WatchdogExpiredError`) or a call resumed past its budget
    (`RetriesExhaustedError`), and for any other failure of a transaction open for at least
    `expiry` seconds (`transaction.timeout.ms`): the coordinator aborts such a transaction
    and bumps the epoch by itself. `transaction_age` is None when none was open.
    """
    if isinstance(error, WatchdogExpiredError | RetriesExhaustedError):
        return True
    return transaction_age is not None and transaction_age >= expiry


@dataclass(frozen=True, slots=True)
class ProducerRenewal:
    """What the loop needs to replace a producer that fenced itself (module docstring)."""

    new_producer: Callable[[], Producer]
    admin: AdminClient
    group_id: str
    instance_id: str
    # The producer's transaction.timeout.ms, in seconds.
    transaction_expiry: float
    # A consumer in the group with the same group.instance.id, for `CheckpointLoop` to
    # replace a fenced one (None: a fenced consumer makes the loop exit).
    new_consumer: Callable[[], Consumer] | None = None

    def holder(self, member_id: str | None, deadline: Deadline) -> Membership:
        """Who holds our `group.instance.id`, asking the group coordinator until `deadline`."""
        attempt = 0
        while True:
            try:
                timeout = max(0.1, deadline.timeout_for_call(_DESCRIBE_TIMEOUT_S))
                futures = self.admin.describe_consumer_groups([self.group_id], request_timeout=timeout)
                description = futures[self.group_id].result(timeout=timeout + 1.0)
            except (KafkaException, TimeoutError) as exc:
                if deadline.expired():
                    cause = translate(exc, operation="describe_consumer_groups") \
                        if isinstance(exc, KafkaException) else exc
                    log.warning("cannot tell who holds instance %s of group %s: %s",
                                self.instance_id, self.group_id, cause)
                    return Membership.UNKNOWN
                attempt += 1
                time.sleep(min(backoff(attempt), deadline.remaining()))
                continue
            holders = [m.member_id for m in description.members if m.group_instance_id == self.instance_id]
            if not holders:
                return Membership.ABSENT
            return Membership.OURS if member_id and member_id in holders else Membership.REPLACED

    def released(self, member_id: str | None, deadline: Deadline, pause: float = 1.0) -> Membership:
        """Who holds our `group.instance.id` once nobody but us does, or at `deadline`.

        Asks `holder` until it is not `REPLACED` (a member id left by a lost JoinGroup of
        ours expires with its session) or `deadline` passes; returns the last answer.
        """
        while True:
            holder = self.holder(member_id, deadline)
            if holder is not Membership.REPLACED or deadline.expired():
                return holder
            time.sleep(min(pause, deadline.remaining()))
