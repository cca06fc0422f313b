"""`FaustConnector`'s start-up against a real broker, in-process (no Faust worker needed):
it refuses, in one line, to start without Torpor's topics or on a journal another worker holds.
The whole connector, as a worker, is tested by `test_examples.py`."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.processors.test_processor import Deployment, deployment
from torpor.connectors.echo import ECHO_SPEC
from torpor.connectors.journal import EffectJournal
from torpor.faust import App, FaustConnector
from torpor.schemas.errors import ConfigError
from torpor.schemas.records import Dispatch
from torpor.streams.config import KafkaSettings, Settings, TopicSettings

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


def _connector(bootstrap: str, prefix: str, journal_dir: Path) -> FaustConnector:
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=bootstrap), topics=TopicSettings(prefix=prefix))
    app = App(f"test-faust-{uuid.uuid4().hex[:8]}", settings=settings)
    return FaustConnector(app, name="echo", specs=(ECHO_SPEC,), journal_dir=journal_dir, signer=None)


def test_without_torpors_topics_it_names_what_to_do(kafka_bootstrap: str, tmp_path: Path) -> None:
    connector = _connector(kafka_bootstrap, f"test.nofaust.{uuid.uuid4().hex[:8]}.", tmp_path / "journal")
    with pytest.raises(ConfigError, match=r"connector:echo cannot start: .*inputs.*torpor topics create"):
        _first_call(connector)


def test_a_journal_another_worker_holds_is_refused(deployment: Deployment, tmp_path: Path) -> None:
    held = EffectJournal(tmp_path / "journal")
    try:
        connector = _connector(deployment.bootstrap, deployment.prefix, tmp_path / "journal")
        with pytest.raises(ConfigError, match="is another worker using it"):
            _first_call(connector)
    finally:
        held.close()
