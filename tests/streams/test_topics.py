"""streams/topics.py and streams/admin.py: the topic table, and ensure_topics on a real broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from tests.conftest import wait_for_leaders
from torpor.schemas.errors import ConfigError
from torpor.streams.admin import ensure_topics, inspect_topics
from torpor.streams.config import KafkaSettings, Settings, TopicSettings
from torpor.streams.deadline import Deadline
from torpor.streams.errors import TopicLayoutError
from torpor.streams.topics import LAYOUTS, Topic, TopicNames, replication_for, topic_specs

FOREVER = "-1"


# --- the table --------------------------------------------------------------------------


def test_names_are_the_prefix_and_the_topic() -> None:
    names = TopicNames.for_prefix("acme.")

    assert names.all() == (
        "acme.inputs",
        "acme.outbox",
        "acme.events",
        "acme.receipts",
        "acme.changelog",
        "acme.parked",
        "acme.toolsets",
    )
    assert names.of(Topic.CHANGELOG) == names.changelog == "acme.changelog"


def test_the_table_covers_every_topic_and_sets_every_retention_explicitly() -> None:
    assert set(LAYOUTS) == set(Topic)
    for topic, layout in LAYOUTS.items():
        policy = layout.config["cleanup.policy"]
        assert policy in ("delete", "compact"), topic
        if policy == "delete":
            # Never the broker's default: each topic says how long it keeps records, and why.
            assert "retention.ms" in layout.config, topic
        assert layout.why, topic


def test_the_specs_follow_the_design() -> None:
    specs = {spec.topic: spec for spec in topic_specs(TopicSettings(partitions=4), brokers=1)}

    assert dict(specs[Topic.INPUTS].config) == {
        "cleanup.policy": "delete",
        "retention.ms": FOREVER,
        "retention.bytes": "-1",
        "message.timestamp.type": "LogAppendTime",
        "min.insync.replicas": "1",
    }
    assert specs[Topic.RECEIPTS].config["retention.ms"] == FOREVER
    assert specs[Topic.CHANGELOG].config == {"cleanup.policy": "compact", "min.insync.replicas": "1"}
    assert specs[Topic.CHANGELOG].partitions == specs[Topic.INPUTS].partitions == 4
    assert specs[Topic.TOOLSETS].config == {"cleanup.policy": "compact", "min.insync.replicas": "1"}
    assert specs[Topic.TOOLSETS].partitions == 1
    for topic in (Topic.OUTBOX, Topic.EVENTS, Topic.PARKED):
        assert specs[topic].config["cleanup.policy"] == "delete"
        assert int(specs[topic].config["retention.ms"]) > 0


def test_an_existing_inputs_topic_decides_the_partitions_of_the_topics_that_follow_it() -> None:
    specs = {spec.topic: spec for spec in topic_specs(TopicSettings(partitions=6), brokers=1,
                                                      inputs_partitions=12)}

    assert specs[Topic.CHANGELOG].partitions == 12
    assert specs[Topic.OUTBOX].partitions == 12
    assert specs[Topic.TOOLSETS].partitions == 1


def test_replication_follows_the_cluster_size_unless_a_factor_is_set() -> None:
    def replication(brokers: int, factor: int | None = None) -> set[tuple[int, str]]:
        specs = topic_specs(TopicSettings(replication_factor=factor), brokers=brokers)
        return {(spec.replication_factor, spec.config["min.insync.replicas"]) for spec in specs}

    assert replication(1) == {(1, "1")}  # a laptop broker: one copy
    assert replication(2) == {(2, "1")}  # one broker down must not stop the writes
    assert replication(3) == {(3, "2")}  # what production runs
    assert replication(6) == {(3, "2")}  # more brokers, still three copies
    assert replication(6, factor=5) == {(5, "3")}  # an operator's choice wins; a majority in sync
    assert replication(3, factor=1) == {(1, "1")}


# --- ensure_topics against a real broker ------------------------------------------------


@pytest.fixture
def prefix(admin: AdminClient) -> Iterator[str]:
    """A topic prefix unique to the test; every topic under it is deleted afterwards."""
    unique = f"test.topics.{uuid.uuid4().hex[:8]}."
    yield unique
    ours = [name for name in admin.list_topics(timeout=10).topics if name.startswith(unique)]
    if ours:
        for future in admin.delete_topics(ours, operation_timeout=30).values():
            future.result(timeout=60)


def settings_for(
    bootstrap: str, prefix: str, *, partitions: int = 3, replication_factor: int | None = None
) -> Settings:
    return Settings(
        kafka=KafkaSettings(bootstrap_servers=bootstrap),
        topics=TopicSettings(prefix=prefix, partitions=partitions, replication_factor=replication_factor),
    )


def describe(admin: AdminClient, name: str) -> dict[str, str]:
    resource = ConfigResource(ResourceType.TOPIC, name)
    entries = admin.describe_configs([resource], request_timeout=10)[resource].result(timeout=15)
    return {key: entry.value for key, entry in entries.items()}


def partitions_of(admin: AdminClient, name: str) -> int:
    return len(admin.list_topics(topic=name, timeout=10).topics[name].partitions)


def create(admin: AdminClient, name: str, partitions: int, config: dict[str, str]) -> None:
    topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)
    admin.create_topics([topic], operation_timeout=15)[name].result(timeout=30)
    wait_for_leaders(admin, name, partitions)


@pytest.mark.kafka
def test_ensure_topics_creates_every_topic_with_its_config(
    admin: AdminClient, kafka_bootstrap: str, prefix: str
) -> None:
    settings = settings_for(kafka_bootstrap, prefix, partitions=3)
    names = TopicNames.for_prefix(prefix)

    ensured = ensure_topics(admin, settings, Deadline.after(30))

    assert ensured.created == names.all()
    assert ensured.existing == ()
    assert ensured.partitions == 3
    inputs = describe(admin, names.inputs)
    assert (inputs["cleanup.policy"], inputs["retention.ms"]) == ("delete", FOREVER)
    assert inputs["message.timestamp.type"] == "LogAppendTime"
    assert describe(admin, names.receipts)["retention.ms"] == FOREVER
    assert describe(admin, names.changelog)["cleanup.policy"] == "compact"
    assert describe(admin, names.toolsets)["cleanup.policy"] == "compact"
    # No replication factor set: the broker count decides (one on the test broker).
    metadata = admin.list_topics(timeout=10)
    expected = replication_for(len(metadata.brokers))
    for name in names.all():
        assert {len(p.replicas) for p in metadata.topics[name].partitions.values()} == {expected.factor}, name
        assert describe(admin, name)["min.insync.replicas"] == str(expected.min_insync), name
    assert describe(admin, names.outbox)["retention.ms"] == LAYOUTS[Topic.OUTBOX].config["retention.ms"]
    assert describe(admin, names.events)["retention.ms"] == LAYOUTS[Topic.EVENTS].config["retention.ms"]
    assert describe(admin, names.parked)["retention.ms"] == LAYOUTS[Topic.PARKED].config["retention.ms"]
    for name in names.all():
        assert partitions_of(admin, name) == (1 if name == names.toolsets else 3), name


@pytest.mark.kafka
def test_ensure_topics_twice_creates_nothing_the_second_time(
    admin: AdminClient, kafka_bootstrap: str, prefix: str
) -> None:
    settings = settings_for(kafka_bootstrap, prefix)
    names = TopicNames.for_prefix(prefix)
    ensure_topics(admin, settings, Deadline.after(30))
    before = {name: describe(admin, name) for name in names.all()}

    again = ensure_topics(admin, settings, Deadline.after(30))

    assert again.created == ()
    assert again.existing == names.all()
    assert {name: describe(admin, name) for name in names.all()} == before


@pytest.mark.kafka
def test_ensure_topics_creates_only_what_is_missing_and_follows_the_existing_inputs(
    admin: AdminClient, kafka_bootstrap: str, prefix: str
) -> None:
    names = TopicNames.for_prefix(prefix)
    create(admin, names.inputs, 4, {"cleanup.policy": "delete", "retention.ms": FOREVER,
                                    "message.timestamp.type": "LogAppendTime"})

    # The setting says 2, but the inputs already have 4: the changelog must follow the broker.
    ensured = ensure_topics(admin, settings_for(kafka_bootstrap, prefix, partitions=2), Deadline.after(30))

    assert ensured.existing == (names.inputs,)
    assert names.changelog in ensured.created
    assert ensured.partitions == 4
    assert partitions_of(admin, names.changelog) == 4


@pytest.mark.kafka
def test_a_changelog_with_fewer_partitions_than_inputs_is_refused_with_the_fix(
    admin: AdminClient, kafka_bootstrap: str, prefix: str
) -> None:
    names = TopicNames.for_prefix(prefix)
    create(admin, names.inputs, 3, {})
    create(admin, names.changelog, 2, {"cleanup.policy": "compact"})

    with pytest.raises(TopicLayoutError) as caught:
        ensure_topics(admin, settings_for(kafka_bootstrap, prefix, partitions=3), Deadline.after(30))

    message = str(caught.value)
    assert f"{names.changelog} has 2 partitions but {names.inputs} has 3" in message
    assert f"--alter --topic {names.changelog} --partitions 3" in message
    assert isinstance(caught.value, ConfigError)


@pytest.mark.kafka
def test_a_changelog_with_more_partitions_than_inputs_is_refused(
    admin: AdminClient, kafka_bootstrap: str, prefix: str
) -> None:
    names = TopicNames.for_prefix(prefix)
    create(admin, names.inputs, 2, {})
    create(admin, names.changelog, 3, {"cleanup.policy": "compact"})

    with pytest.raises(TopicLayoutError, match="cannot shrink"):
        ensure_topics(admin, settings_for(kafka_bootstrap, prefix, partitions=2), Deadline.after(30))


@pytest.mark.kafka
def test_a_changelog_that_is_not_compacted_is_refused_with_the_fix(
    admin: AdminClient, kafka_bootstrap: str, prefix: str
) -> None:
    names = TopicNames.for_prefix(prefix)
    create(admin, names.changelog, 3, {"cleanup.policy": "delete"})

    with pytest.raises(TopicLayoutError) as caught:
        ensure_topics(admin, settings_for(kafka_bootstrap, prefix, partitions=3), Deadline.after(30))

    message = str(caught.value)
    assert f"topic {names.changelog} has cleanup.policy='delete' but must be 'compact'" in message
    assert f"--entity-name {names.changelog} --add-config cleanup.policy=compact" in message


@pytest.mark.kafka
def test_a_replication_factor_above_the_broker_count_is_a_config_error(
    admin: AdminClient, kafka_bootstrap: str, prefix: str
) -> None:
    brokers = len(admin.list_topics(timeout=10).brokers)
    settings = settings_for(kafka_bootstrap, prefix, replication_factor=brokers + 1)

    with pytest.raises(ConfigError, match="TORPOR_REPLICATION_FACTOR"):
        ensure_topics(admin, settings, Deadline.after(30))


@pytest.mark.kafka
def test_an_inputs_topic_whose_producers_stamp_the_time_is_refused_with_the_fix(
    admin: AdminClient, kafka_bootstrap: str, prefix: str
) -> None:
    """The processor judges key windows and expiry at the broker's append time: with
    CreateTime, a writer would choose it."""
    names = TopicNames.for_prefix(prefix)
    create(admin, names.inputs, 3, {"message.timestamp.type": "CreateTime"})

    with pytest.raises(TopicLayoutError) as caught:
        ensure_topics(admin, settings_for(kafka_bootstrap, prefix, partitions=3), Deadline.after(30))

    message = str(caught.value)
    assert f"topic {names.inputs} has message.timestamp.type='CreateTime'" in message
    assert "but must be 'LogAppendTime'" in message
    assert f"--entity-name {names.inputs} --add-config message.timestamp.type=LogAppendTime" in message


@pytest.mark.kafka
def test_topics_with_fewer_replicas_than_the_layout_are_drift_not_a_problem(
    admin: AdminClient, kafka_bootstrap: str, prefix: str
) -> None:
    """A topic made before the cluster grew still works: `topics check` shows it, refuses nothing."""
    ensure_topics(admin, settings_for(kafka_bootstrap, prefix, replication_factor=1), Deadline.after(30))

    states = inspect_topics(admin, settings_for(kafka_bootstrap, prefix, replication_factor=2),
                            Deadline.after(30))

    assert [state.problems for state in states] == [()] * len(states)
    assert all("1 replicas (the layout says 2)" in state.drift for state in states), states
