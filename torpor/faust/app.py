"""`App`: a `faust.App` that may read Torpor's topics: read_committed, on Torpor's bootstrap.

Contract. `App(id, settings=settings, **faust_options)` is a `faust.App` in every
respect but one: its consumer reads `isolation_level=read_committed`. Faust reads
read_committed only with `processing_guarantee="exactly_once"` (its transactional mode,
which DESIGN 6 explains Torpor does not use), and a reader of the `outbox` that sees
records of aborted transactions would run a tool for a turn that never became durable
(DESIGN invariant 4); `receipts` and `events` are written in the same transactions. So
`ReadCommittedTransport` gives Faust's aiokafka consumer the read_committed isolation
level before it starts, whatever the processing guarantee.

`broker` defaults to `broker_url(settings)`, the `kafka://` URL of Torpor's bootstrap
servers. Faust never creates Torpor's topics: `App.topic` declares nothing that is not
internal to Faust, and `torpor topics create` makes Torpor's (`TorporTopics`, the Faust
view of them, refuses an app that is not this one).

Journals registered with `keep_open` are closed after the app has stopped and flushed its
producer, so no delivery report arrives at a closed journal.
"""

from __future__ import annotations

from typing import Any, Final

import aiokafka
import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from torpor.connectors.journal import EffectJournal
from torpor.streams.config import Settings

READ_COMMITTED: Final = "read_committed"


def broker_url(settings: Settings) -> str:
    """Torpor's bootstrap servers as Faust's broker URL (``kafka://h1:p1;h2:p2``)."""
    hosts = [h.strip() for h in settings.kafka.bootstrap_servers.split(",") if h.strip()]
    return "kafka://" + ";".join(hosts)


class ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's aiokafka consumer, reading only committed records (module docstring)."""

    def _create_worker_consumer(self, transport: faust_aiokafka.Transport) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka takes the level only in its constructor, which Faust calls with its own
        # choice; the fetcher reads this attribute when `start()` builds it, and Faust
        # starts the consumer only after this method returns.
        consumer._isolation_level = READ_COMMITTED
        return consumer


class ReadCommittedConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)


class ReadCommittedTransport(faust_aiokafka.Transport):
    """The aiokafka transport with `ReadCommittedConsumer`."""

    Consumer = ReadCommittedConsumer


class App(faust.App):
    """A Faust app for Torpor's topics (module docstring)."""

    def __init__(self, id: str, *, settings: Settings, **options: Any) -> None:
        options.setdefault("broker", broker_url(settings))
        super().__init__(id, **options)
        self.torpor_settings = settings
        self._journals: list[EffectJournal] = []

    def _new_transport(self) -> ReadCommittedTransport:
        return ReadCommittedTransport(self.conf.broker_consumer, self)

    def keep_open(self, journal: EffectJournal) -> None:
        """Close `journal` once the app has stopped (module docstring)."""
        self._journals.append(journal)

    async def on_stop(self) -> None:
        await super().on_stop()  # stops the consumer, then flushes the producer
        for journal in self._journals:
            journal.close()
        self._journals.clear()
