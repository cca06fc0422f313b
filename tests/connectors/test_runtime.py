"""The connector runtime in-process against a real broker: bounded concurrency, redelivery.

Dispatches are produced straight to the outbox (as a processor's committed transaction
would leave them) and served by `ConnectorRuntime` running in this test's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.connectors.test_journal import CAPABILITY
from tests.processors.test_processor import Deployment, deployment
from tests.waiting import wait_until
from torpor.connectors.functions import Call, tool
from torpor.connectors.journal import EffectJournal, EffectState
from torpor.connectors.runtime import ConnectorFactory, ConnectorRuntime
from torpor.schemas.codec import encode_value
from torpor.schemas.records import Dispatch, TextBlock, ToolResult
from torpor.streams.config import DEFAULT_MAX_INPUT_BYTES, KafkaSettings, Settings, TopicSettings
from torpor.streams.membership import GroupWatch

pytestmark = pytest.mark.kafka

__all__ = ["deployment"]  # the fixture, shared with test_processor

RUNNING: list[str] = []
CALLS: list[str] = []
MOST: list[int] = [0]
# A call waits until this many have run at once (the concurrency test sets 2): the bound
# is then reached however the dispatches trickle in, not only if two arrive within 0.3 s.
TOGETHER: list[int] = [1]


@tool(description="Takes a while.", toolset="test")
async def slow(args: dict[str, Any], call: Call) -> str:
    CALLS.append(call.request_id)
    RUNNING.append(call.request_id)
    MOST[0] = max(MOST[0], len(RUNNING))
    async with asyncio.timeout(60):
        while MOST[0] < TOGETHER[0]:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    RUNNING.remove(call.request_id)
    return f"done {call.request_id}"


@tool(description="Answers more than one input may carry.", toolset="test")
async def huge(args: dict[str, Any], call: Call) -> str:
    return "H" * DEFAULT_MAX_INPUT_BYTES


def _dispatch(n: int, tool: str = "slow") -> Dispatch:
    return Dispatch(request_id=f"rq-{n}", thread_id=f"t-{n}", call_id=f"c-{n}", tool=tool, arguments="{}",
                    capability=CAPABILITY, attempt=0, created_at=1, deadline=None, kind="invoke")


def _produce(deployment: Deployment, *dispatches: Dispatch) -> None:
    producer = Producer({"bootstrap.servers": deployment.bootstrap})
    for d in dispatches:
        producer.produce(deployment.topic("outbox"), key=d.thread_id.encode(), value=encode_value(d))
    assert producer.flush(30) == 0


def _committed(deployment: Deployment) -> int:
    """How many outbox records the runtime's group has committed, over every partition."""
    consumer = Consumer({"bootstrap.servers": deployment.bootstrap, "group.id": f"g-{deployment.prefix}"})
    try:
        topic = deployment.topic("outbox")
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        found = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        return sum(max(tp.offset, 0) for tp in found)
    finally:
        consumer.close()


def _results(deployment: Deployment) -> list[ToolResult]:
    return [i.body for i in deployment.inputs() if isinstance(i.body, ToolResult)]


def _serve(deployment: Deployment, journal: Path, until: Callable[[ConnectorRuntime], bool],
           factory: ConnectorFactory = slow, *, librdkafka: tuple[tuple[str, str], ...] = (),
           timeout: float = 60, **options: Any) -> None:
    """Run a runtime in this thread's event loop until `until(runtime)` holds (`timeout` s at
    most; `until` is asked on a thread of its own, so it may block)."""
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=deployment.bootstrap,
                                            librdkafka_overrides=librdkafka),
                        topics=TopicSettings(prefix=deployment.prefix))
    runtime = ConnectorRuntime(settings, factory, group=f"g-{deployment.prefix}",
                               journal=EffectJournal(journal), **options)

    async def go() -> None:
        done = asyncio.Event()

        async def watch() -> None:
            await asyncio.to_thread(wait_until, lambda: until(runtime), timeout=timeout,
                                    message="the runtime's work")
            done.set()

        watcher = asyncio.create_task(watch())
        await runtime.run(done.is_set)
        await watcher

    asyncio.run(go())


def test_concurrency_is_bounded_and_every_dispatch_is_answered(
    deployment: Deployment, tmp_path: Path
) -> None:
    _produce(deployment, *(_dispatch(n) for n in range(4)))
    CALLS.clear()
    MOST[0] = 0
    TOGETHER[0] = 2
    try:
        _serve(deployment, tmp_path / "journal",
               lambda _: len({r.request_id for r in _results(deployment)}) >= 4, max_concurrency=2)
    finally:
        TOGETHER[0] = 1
    assert MOST[0] == 2  # two at a time: never more, and the bound was reached
    assert sorted(r.request_id for r in _results(deployment)) == [f"rq-{n}" for n in range(4)]
    journal = EffectJournal(tmp_path / "journal")
    assert {e.state for e in journal.effects()} == {EffectState.DELIVERED}
    journal.close()
    assert _committed(deployment) == 4  # the asynchronous commits were answered, the last one at the stop


def test_a_redelivered_dispatch_is_not_run_again(deployment: Deployment, tmp_path: Path) -> None:
    _produce(deployment, _dispatch(0))
    CALLS.clear()
    _serve(deployment, tmp_path / "journal", lambda _: len(_results(deployment)) >= 1)
    assert CALLS == ["rq-0"]
    # The same dispatch again (a processor re-dispatching, an outbox offset reset).
    _produce(deployment, _dispatch(0))
    _serve(deployment, tmp_path / "journal", lambda runtime: runtime.handled >= 1)
    assert CALLS == ["rq-0"]  # journaled: taken, never run twice
    assert [r.request_id for r in _results(deployment)] == ["rq-0"]


class StuckOnce(GroupWatch):
    """Says the consumer is stuck once, when `armed`: the state librdkafka#2944 leaves a
    consumer in (out of its group for good after a broker restart) cannot be made on demand."""

    def __init__(self) -> None:
        super().__init__(90)
        self.armed = False

    def stuck(self, member_id: str | None, now: float) -> bool:
        fire, self.armed = self.armed, False
        return fire or super().stuck(member_id, now)


def test_a_consumer_out_of_its_group_is_replaced_and_the_new_one_serves_without_repeats(
    deployment: Deployment, tmp_path: Path
) -> None:
    _produce(deployment, _dispatch(0))
    CALLS.clear()
    watch, produced = StuckOnce(), []

    def until(runtime: ConnectorRuntime) -> bool:
        if runtime.handled >= 1 and runtime.consumers_replaced == 0:
            watch.armed = True
        if runtime.consumers_replaced == 1 and not produced:
            produced.append(True)  # only the new consumer can take these
            _produce(deployment, _dispatch(1), _dispatch(2))
        return len({r.request_id for r in _results(deployment)}) >= 3

    _serve(deployment, tmp_path / "journal", until, group_watch=watch)
    assert sorted(CALLS) == ["rq-0", "rq-1", "rq-2"]  # each run once, whichever consumer took it
    assert {r.request_id for r in _results(deployment)} == {"rq-0", "rq-1", "rq-2"}
    journal = EffectJournal(tmp_path / "journal")
    assert {e.request_id: e.state for e in journal.effects()} == dict.fromkeys(
        ("rq-0", "rq-1", "rq-2"), EffectState.DELIVERED)
    journal.close()
    assert _committed(deployment) == 3  # the new consumer commits for the group


def test_an_answer_too_large_for_one_input_is_delivered_as_an_error_the_model_can_read(
    deployment: Deployment, tmp_path: Path
) -> None:
    """The processor would park it unread as oversized, and the call would wait forever."""
    _produce(deployment, _dispatch(1, "huge"))
    _serve(deployment, tmp_path / "journal", lambda _: bool(_results(deployment)), factory=huge)
    [answer] = _results(deployment)
    assert (answer.request_id, answer.ok) == ("rq-1", False)
    [block] = answer.content
    assert isinstance(block, TextBlock) and "TORPOR_MAX_INPUT_BYTES" in block.text
    assert f"more than the {DEFAULT_MAX_INPUT_BYTES}" in block.text
