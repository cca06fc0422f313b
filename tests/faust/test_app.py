"""`torpor.faust.App` and `TorporTopics`: only an app that reads committed records gets Torpor's topics."""

from __future__ import annotations

import faust
import pytest

from torpor.faust import App, TorporTopics, broker_url
from torpor.faust.app import ReadCommittedTransport
from torpor.schemas.errors import ConfigError
from torpor.schemas.records import Receipt
from torpor.streams.config import KafkaSettings, Settings, TopicSettings

SETTINGS = Settings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1, 127.0.0.2:2"),
                    topics=TopicSettings(prefix="test.faustapp."))


def test_the_broker_is_torpors_bootstrap_as_a_faust_url() -> None:
    assert broker_url(SETTINGS) == "kafka://127.0.0.1:1;127.0.0.2:2"
    app = App("test-faust-broker", settings=SETTINGS)
    assert [str(url) for url in app.conf.broker] == ["kafka://127.0.0.1:1", "kafka://127.0.0.2:2"]


def test_a_plain_faust_app_is_refused_it_would_read_aborted_records() -> None:
    plain = faust.App("test-faust-plain", broker=broker_url(SETTINGS))
    with pytest.raises(ConfigError, match=r"torpor\.faust\.App, whose consumer reads only committed records"):
        TorporTopics.of(plain)


def test_an_app_whose_transport_was_swapped_is_refused() -> None:
    app = App("test-faust-swapped", settings=SETTINGS)
    app.transport = faust.App("test-faust-other", broker=broker_url(SETTINGS)).transport
    with pytest.raises(ConfigError):
        TorporTopics.of(app)


def test_torpors_topics_are_named_by_the_prefix_and_never_declared() -> None:
    app = App("test-faust-topics", settings=SETTINGS)
    assert isinstance(app.transport, ReadCommittedTransport)
    topics = TorporTopics.of(app)
    assert topics.receipts.get_topic_name() == "test.faustapp.receipts"
    assert topics.outbox.get_topic_name() == "test.faustapp.outbox"
    assert not any(t.internal for t in (topics.outbox, topics.events, topics.receipts, topics.inputs))
    assert topics.receipts.value_serializer.record_type is Receipt  # type: ignore[union-attr]
