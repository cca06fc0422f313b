"""Waiting for the topics a long-running service needs, said in one line.

A connector started beside its processor (one compose file, one pod, one systemd target)
may come up before the processor has created the topics, or while it does. Its clients
never create a topic (`allow.auto.create.topics=false`), so it would die on
`UNKNOWN_TOPIC_OR_PART`, and its supervisor would restart it in a loop. Instead it waits:

    waiting for topics p.inputs, p.outbox on 127.0.0.1:9092 (create them with
    `torpor topics create` or start a processor)

once, and `topics p.inputs, p.outbox appeared after 12s` once they have a leader on
every partition. Not asked to wait (`wait=False`), the same check raises
`MissingTopicsError` (a `ConfigError`: exit 1) naming the missing topics in one line.

Contract. `TopicWait(client, names, bootstrap, wait=...)`; `check()` returns the
partition count of each topic once every one of `names` is ready, or None while waiting
(a broker that does not answer is waited for the same way, and said once); the caller
polls it at its own pace (`PAUSE_S`), between its own checks for a stop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol

from confluent_kafka import KafkaException
from confluent_kafka.admin._metadata import ClusterMetadata  # the public name is not re-exported for typing

from torpor.schemas.errors import ConfigError
from torpor.streams.admin import topic_ready
from torpor.streams.errors import kafka_error_of

log: Final = logging.getLogger(__name__)

# Between two metadata requests while waiting: topics appear within a second of their
# creation, and a request every second costs the broker nothing.
PAUSE_S: Final = 1.0
# One metadata request may take this long (a broker that does not answer).
CALL_S: Final = 5.0
HOW_TO_CREATE: Final = "create them with `torpor topics create` or start a processor"


class MissingTopicsError(ConfigError):
    """Topics the service needs do not exist, and it was not asked to wait for them."""


class _HasMetadata(Protocol):
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata: ...


class TopicWait:
    """Checks, and says once, whether `names` exist with a leader on every partition."""

    def __init__(self, client: _HasMetadata, names: Sequence[str], bootstrap: str, *, wait: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._names = tuple(names)
        self._bootstrap = bootstrap
        self._wait = wait
        self._clock = clock
        self._since: float | None = None
        self._said_missing: tuple[str, ...] = ()
        self._said_unreachable = False

    def check(self) -> Mapping[str, int] | None:
        """Partition counts of every topic once all are ready; None while waiting.

        Raises `MissingTopicsError` when some are missing and waiting was not asked for.
        """
        if self._since is None:
            self._since = self._clock()
        try:
            metadata = self._client.list_topics(timeout=CALL_S)
        except KafkaException as exc:
            if not self._said_unreachable:
                log.warning("broker at %s unreachable (%s); retrying until it answers", self._bootstrap,
                            kafka_error_of(exc).str())
                self._said_unreachable = True
            return None
        if self._said_unreachable:
            log.info("broker at %s answers again", self._bootstrap)
            self._said_unreachable = False
        missing = tuple(name for name in self._names if not topic_ready(metadata, name))
        if not missing:
            if self._said_missing:
                log.info("topics %s appeared after %.0fs; starting", ", ".join(self._said_missing),
                         self._clock() - self._since)
            return {name: len(metadata.topics[name].partitions) for name in self._names}
        if not self._wait:
            raise MissingTopicsError(f"topics {', '.join(missing)} do not exist on {self._bootstrap} "
                                     f"({HOW_TO_CREATE})")
        if not self._said_missing:
            log.warning("waiting for topics %s on %s (%s)", ", ".join(missing), self._bootstrap,
                        HOW_TO_CREATE)
            self._said_missing = missing
        return None

