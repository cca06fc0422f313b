"""The lag sampler (torpor/inspector/lagwatch.py) against a real broker and a real processor.

Inputs sent while no processor runs show as lag on their partitions (counted as records:
the commit marker of the transaction they were sent in is not an input); a processor
started afterwards drains them to 0, though each partition's end stays one past what it
committed (the marker), and it shows as the group's one member, `p0`, owning every
partition. Before `inputs` exists the sampler says so and resumes once it does; with no
broker at all it says so, logs it once, and keeps trying; a broker of the test's own,
stopped and restarted, is said once each way, and sampling resumes.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from tests.faults.own_broker import OwnBroker
from tests.processors.test_processor import PARTITIONS, Deployment
from tests.waiting import wait_until
from torpor.inspector.lagwatch import LagView, LagWatch
from torpor.schemas.codec import encode_value
from torpor.schemas.records import (
    Budgets,
    Capability,
    CreateThread,
    Input,
    ThreadConfig,
)
from torpor.streams.admin import ensure_topics
from torpor.streams.config import KafkaSettings, Settings, TopicSettings
from torpor.streams.deadline import Deadline
from torpor.streams.partitioner import partition_for
from torpor.streams.topics import TopicNames

WAIT_S: Final = 120.0
EVERY_S: Final = 0.5


def _settings(bootstrap: str, prefix: str) -> Settings:
    return Settings(kafka=KafkaSettings(bootstrap_servers=bootstrap),
                    topics=TopicSettings(prefix=prefix, partitions=PARTITIONS))


@pytest.fixture
def deployment(kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> Iterator[Deployment]:
    found = Deployment(kafka_bootstrap, tmp_path, prefix=f"test.lag.{uuid.uuid4().hex[:10]}.")
    yield found
    found.stop_all()
    names = list(TopicNames.for_prefix(found.prefix).all())
    for future in admin.delete_topics(names, operation_timeout=30).values():
        with contextlib.suppress(Exception):  # a test that failed before the topics existed
            future.result(timeout=60)


def _creation(thread_id: str) -> Input:
    config = ThreadConfig(
        model="scripted", system_prompt="You wait.", tools=(),
        capability=Capability(tenant="test", tools=(), scopes=(), expires_at=None),
        budgets=Budgets(max_turns=None, max_children=None, max_tool_retries=2, max_invalid_calls=3),
        parent=None, context_window=200_000, compaction_threshold=0.8, allow_implicit_create=False)
    return Input(message_id=f"{thread_id}-create", thread_id=thread_id, created_at=1_000, source="user:test",
                 expires_at=None, key_id=None, signature=None, body=CreateThread(config, (), ()))


def _send_in_one_transaction(deployment: Deployment, records: list[Input]) -> None:
    producer = Producer({"bootstrap.servers": deployment.bootstrap, "partitioner": "murmur2_random",
                         "transactional.id": f"lag-test-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for record in records:
        producer.produce(deployment.topic("inputs"), key=record.thread_id.encode(),
                         value=encode_value(record))
    producer.commit_transaction(30)


def _sampled(watch: LagWatch) -> LagView | None:
    view = watch.view()
    return view if view.error is None and view.at_ms is not None else None


@pytest.mark.kafka
def test_inputs_sent_while_stopped_show_lag_that_a_started_processor_drains_to_zero(
        deployment: Deployment, admin: AdminClient) -> None:
    settings = _settings(deployment.bootstrap, deployment.prefix)
    ensure_topics(admin, settings, Deadline.after(60))
    group = f"app-{deployment.prefix}"  # what Deployment.processor_args gives --app
    threads = [f"lag-{i}-{uuid.uuid4().hex[:6]}" for i in range(7)]
    expected = Counter(partition_for(t.encode(), PARTITIONS) for t in threads)
    _send_in_one_transaction(deployment, [_creation(t) for t in threads])

    watch = LagWatch(settings, group, every=EVERY_S)
    watch.start()
    try:
        def behind() -> LagView | None:
            view = _sampled(watch)
            return view if view and {p.partition: p.lag for p in view.partitions if p.lag} == dict(expected) \
                else None

        view = wait_until(behind, timeout=WAIT_S, message=f"the lag of the inputs sent: {dict(expected)}")
        assert [p.partition for p in view.partitions] == list(range(PARTITIONS))
        assert all(p.committed is None and p.owner is None for p in view.partitions)
        # Each touched partition holds its records and the transaction's commit marker.
        ends = {p.partition: p.end for p in view.partitions if p.end}
        assert ends == {p: n + 1 for p, n in expected.items()}
        assert view.members == ()
        assert view.as_json()["total_lag"] == len(threads)

        deployment.start(deployment.processor_args("p0"), "processor")

        def drained() -> LagView | None:
            view = _sampled(watch)
            ok = (view is not None and all(p.lag == 0 for p in view.partitions)
                  and len(view.members) == 1 and all(p.owner == "p0" for p in view.partitions)
                  and all(p.committed is not None for p in view.partitions if p.partition in expected))
            return view if ok else None

        view = wait_until(drained, timeout=WAIT_S,
                          message=lambda: f"lag drained and p0 a member; processor log:\n"
                                  f"{deployment.log('processor')[-3000:]}")
        (member,) = view.members
        assert member.instance_id == "p0" and member.partitions == tuple(range(PARTITIONS))
        assert member.host and member.client_id
        # Caught up behind a marker: the end is one past the committed offset, and that is lag 0.
        for p in view.partitions:
            if p.partition in expected:
                assert (p.committed, p.end, p.lag) == (expected[p.partition], expected[p.partition] + 1, 0)
        # The chart's series went from the backlog down to 0.
        series = watch.series(0)
        for partition, count in expected.items():
            lags = [lag for _, lag in series[partition]]
            assert count in lags and lags[-1] == 0, lags
    finally:
        watch.stop()


@pytest.mark.kafka
def test_before_inputs_exists_the_sampler_says_so_and_resumes_once_it_does(
        deployment: Deployment, admin: AdminClient) -> None:
    settings = _settings(deployment.bootstrap, deployment.prefix)
    watch = LagWatch(settings, f"app-{deployment.prefix}", every=EVERY_S)
    watch.start()
    try:
        error = wait_until(lambda: watch.view().error, timeout=WAIT_S, message="the sampler's complaint")
        assert "does not exist yet" in error and deployment.topic("inputs") in error
        assert watch.view().at_ms is None and watch.view().partitions == ()
        ensure_topics(admin, settings, Deadline.after(60))
        view = wait_until(lambda: _sampled(watch), timeout=WAIT_S, message="a sample once inputs exists")
        assert [(p.partition, p.lag) for p in view.partitions] == [(p, 0) for p in range(PARTITIONS)]
        assert view.group_state in ("dead", "none", "unknown", "empty")
    finally:
        watch.stop()


def test_with_no_broker_the_sampler_says_so_logs_once_and_keeps_trying(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="torpor.inspector.lagwatch")
    watch = LagWatch(_settings("127.0.0.1:1", "test.lag.nobroker."), "app", every=0.1)
    watch.start()
    try:
        wait_until(lambda: watch.failures >= 3, timeout=WAIT_S, message="three failed samples")
        view = watch.view()
        assert view.error and view.at_ms is None and view.partitions == ()
        assert "Traceback" not in view.error
    finally:
        watch.stop()
    warnings = [r for r in caplog.records if r.name == "torpor.inspector.lagwatch"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


@pytest.mark.kafka
@pytest.mark.parametrize("group", ["", "g" * 40_000], ids=["empty", "huge"])
def test_a_group_id_no_consumer_can_read_is_said_on_the_page_and_the_sampler_goes_on(
        kafka_bootstrap: str, admin: AdminClient, group: str) -> None:
    # The group is the operator's `--app`: the offsets reader refuses an empty one, and the
    # broker never answers for one longer than a protocol string (32,767 bytes).
    settings = _settings(kafka_bootstrap, f"test.lag.{uuid.uuid4().hex[:10]}.")
    ensure_topics(admin, settings, Deadline.after(60))
    watch = LagWatch(settings, group, every=0.1)
    watch.start()
    try:
        wait_until(lambda: watch.failures >= 2, timeout=WAIT_S, message="two failed samples")
        view = watch.view()
        assert view.error and "Traceback" not in view.error and view.at_ms is None, view
        assert watch._thread.is_alive()
    finally:
        watch.stop()
        for future in admin.delete_topics(list(TopicNames.for_prefix(settings.topics.prefix).all()),
                                          operation_timeout=30).values():
            future.result(timeout=60)


class _FailsOnce(LagWatch):
    """A sampler whose first sample raises what no Kafka client raises; later ones succeed."""

    calls = 0

    def _sample(self, admin: AdminClient, consumer: Consumer, offsets: Consumer) -> LagView:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("an answer nobody expected")
        return LagView("app", 1_000 * self.calls, (), (), "stable", None)


def test_an_unexpected_error_is_shown_by_name_and_the_sampler_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="torpor.inspector.lagwatch")
    watch = _FailsOnce(_settings("127.0.0.1:1", "test.lag.unexpected."), "app", every=0.05)
    watch.start()
    try:
        view = wait_until(lambda: _sampled(watch), timeout=WAIT_S, message="a sample after the failure")
        assert view.group_state == "stable" and watch.failures == 0 and watch.calls >= 2
    finally:
        watch.stop()
    said = [r.getMessage() for r in caplog.records if r.name == "torpor.inspector.lagwatch"]
    assert len(said) == 2 and "RuntimeError: an answer nobody expected" in said[0], said
    assert "again" in said[1]


@pytest.mark.kafka
@pytest.mark.slow
def test_a_broker_stopped_and_restarted_is_said_once_and_sampling_resumes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="torpor.inspector.lagwatch")
    broker = OwnBroker.start(tmp_path / "broker")  # never the shared one: this test stops it
    try:
        settings = _settings(broker.bootstrap, f"test.lag.{uuid.uuid4().hex[:10]}.")
        own_admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 2})
        ensure_topics(own_admin, settings, Deadline.after(60))
        watch = LagWatch(settings, "app", every=EVERY_S)
        watch.start()
        try:
            before = wait_until(lambda: _sampled(watch), timeout=WAIT_S, message="a sample before the stop")
            broker.stop()
            away = wait_until(lambda: (view := watch.view()).error and watch.failures >= 3 and view,
                              timeout=WAIT_S, message="the sampler saying the broker is away")
            assert away.partitions == before.partitions  # the last sample, still shown
            broker.restart(topic=TopicNames.for_prefix(settings.topics.prefix).inputs)
            again = wait_until(lambda: (view := _sampled(watch)) and view.at_ms != before.at_ms and view,
                               timeout=WAIT_S, message="a new sample once the broker is back")
            assert [p.partition for p in again.partitions] == list(range(PARTITIONS))
        finally:
            watch.stop()
    finally:
        broker.close()
        # Clients this test made against its broker, freed here on this thread: garbage left
        # for a collection on librdkafka's own thread would abort the process there.
        own_admin = None
        gc.collect()
    said = [r.getMessage() for r in caplog.records if r.name == "torpor.inspector.lagwatch"]
    assert len(said) == 2, said  # once away, once back, however many samples failed
    assert "cannot read" in said[0] and "again" in said[1]
