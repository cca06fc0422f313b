"""A tool's answer produced while the broker is away, past the producer's delivery timeout.

librdkafka gives up on a record after `message.timeout.ms` without a broker. The answer
stayed `done` in the journal, re-sent only at the connector's next start, and the thread
waited for it until then. Now the runtime produces it again until the broker takes it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from tests.connectors.test_runtime import _dispatch, _produce, _results, _serve
from tests.faults.own_broker import OwnBroker
from tests.processors.test_processor import Deployment
from torpor.connectors.functions import Call, tool
from torpor.connectors.journal import EffectJournal, EffectState
from torpor.connectors.runtime import ConnectorRuntime
from torpor.streams.admin import ensure_topics
from torpor.streams.config import KafkaSettings, Settings, TopicSettings
from torpor.streams.deadline import Deadline

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

STARTED = threading.Event()
RELEASE = threading.Event()


@tool(description="Answers once the test lets it.", toolset="test")
async def held(args: dict[str, Any], call: Call) -> str:
    STARTED.set()
    async with asyncio.timeout(120):
        while not RELEASE.is_set():
            await asyncio.sleep(0.05)
    return f"answered {call.request_id}"


@pytest.mark.timeout(900)  # a broker's stop and restart happen inside the wait: each may take minutes here
def test_an_answer_produced_while_the_broker_is_away_arrives_once_it_is_back(
    own_broker: OwnBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    deployment = Deployment(own_broker.bootstrap, tmp_path)
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=own_broker.bootstrap),
                        topics=TopicSettings(prefix=deployment.prefix, partitions=2))
    ensure_topics(AdminClient({"bootstrap.servers": own_broker.bootstrap, "log_level": 2}), settings,
                  Deadline.after(60))
    _produce(deployment, _dispatch(0, "held"))
    STARTED.clear()
    RELEASE.clear()
    phase: list[str] = []

    def until(runtime: ConnectorRuntime) -> bool:
        # Asked over and over on a thread of its own: each step happens once, in order.
        if not phase and STARTED.is_set():
            own_broker.stop()
            RELEASE.set()  # the answer is produced to a broker that is away
            phase.append("stopped")
        elif phase == ["stopped"] and "answer not delivered: KafkaError" in caplog.text \
                and "sending it again" in caplog.text:
            own_broker.restart(topic=deployment.topic("inputs"))
            phase.append("restarted")
        return phase == ["stopped", "restarted"] and any(
            e.request_id == "rq-0" and e.state is EffectState.DELIVERED for e in runtime.journal.effects())

    with caplog.at_level(logging.WARNING, logger="torpor.connectors.runtime"):
        _serve(deployment, tmp_path / "journal", until, held, librdkafka=(("message.timeout.ms", "3000"),),
               timeout=600)
    assert [r.request_id for r in _results(deployment)] == ["rq-0"]
    journal = EffectJournal(tmp_path / "journal")
    assert [(e.request_id, e.state) for e in journal.effects()] == [("rq-0", EffectState.DELIVERED)]
    journal.close()
