"""`FaustConnector`'s start-up against a real broker, in-process (no Faust worker needed):
it waits for Torpor's topics, saying so once (or, not asked to wait, names them in one
line), and refuses a journal another worker holds.
The whole connector, as a worker, is tested by `test_examples.py`."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.processors.test_processor import Deployment, deployment
from tests.waiting import wait_until
from torpor.connectors.echo import ECHO_SPEC
from torpor.connectors.journal import EffectJournal
from torpor.faust import App, FaustConnector
from torpor.schemas.errors import ConfigError
from torpor.schemas.records import Dispatch
from torpor.streams.admin import ensure_topics
from torpor.streams.config import KafkaSettings, Settings, TopicSettings
from torpor.streams.deadline import Deadline
from torpor.streams.topics import TopicNames
from torpor.streams.topicwait import MissingTopicsError

pytestmark = pytest.mark.kafka

__all__ = ["deployment"]  # the fixture, shared with test_processor


async def _nothing() -> AsyncIterator[Dispatch]:
    return
    yield  # an async generator that yields nothing


def _first_call(connector: FaustConnector) -> None:
    async def go() -> None:
        async for _ in connector.calls(_nothing()):
            pass

    asyncio.run(go())


def _settings(bootstrap: str, prefix: str) -> Settings:
    return Settings(kafka=KafkaSettings(bootstrap_servers=bootstrap), topics=TopicSettings(prefix=prefix))


def _connector(bootstrap: str, prefix: str, journal_dir: Path, *, wait: bool = True) -> FaustConnector:
    app = App(f"test-faust-{uuid.uuid4().hex[:8]}", settings=_settings(bootstrap, prefix))
    return FaustConnector(app, name="echo", specs=(ECHO_SPEC,), journal_dir=journal_dir, signer=None,
                          wait_for_topics=wait)


def test_not_asked_to_wait_for_torpors_topics_it_names_them_in_one_line(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    prefix = f"test.nofaust.{uuid.uuid4().hex[:8]}."
    connector = _connector(kafka_bootstrap, prefix, tmp_path / "journal", wait=False)
    with pytest.raises(MissingTopicsError, match=rf"{prefix}outbox, {prefix}inputs, .*torpor topics create"):
        _first_call(connector)


def test_started_before_torpors_topics_it_waits_for_them(
    kafka_bootstrap: str, admin: AdminClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"test.laterfaust.{uuid.uuid4().hex[:8]}."
    connector = _connector(kafka_bootstrap, prefix, tmp_path / "journal")
    started = threading.Thread(target=_first_call, args=(connector,), daemon=True)
    with caplog.at_level(logging.INFO):
        started.start()
        wait_until(lambda: "waiting for topics" in caplog.text, timeout=60, message="the waiting line")
        assert started.is_alive()
        ensure_topics(admin, _settings(kafka_bootstrap, prefix), Deadline.after(60))
        try:
            started.join(timeout=120)
            assert not started.is_alive(), "still waiting after the topics were made"
            assert "appeared after" in caplog.text
        finally:
            for future in admin.delete_topics(list(TopicNames.for_prefix(prefix).all())).values():
                future.result(timeout=60)


def test_a_journal_another_worker_holds_is_refused(deployment: Deployment, tmp_path: Path) -> None:
    held = EffectJournal(tmp_path / "journal")
    try:
        connector = _connector(deployment.bootstrap, deployment.prefix, tmp_path / "journal")
        with pytest.raises(ConfigError, match="is another worker using it"):
            _first_call(connector)
    finally:
        held.close()
