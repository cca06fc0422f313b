"""`ensure_topics`: create the Torpor topics that are missing, then check the invariants.

Contract: `ensure_topics(admin, settings, deadline)` is idempotent. It creates every topic
of `topics.topic_specs` that does not exist yet (another instance creating it at the same
moment is fine), leaves existing topics as they are, waits until the broker's metadata
shows them all, and then verifies the two invariants the processor relies on:

1. the changelog has as many partitions as `inputs`, since the store of inputs partition
   N is restored from changelog partition N;
2. every config of `topics.REQUIRED` holds: the topics the layout compacts (the changelog,
   the toolsets) have `cleanup.policy=compact`, or live store rows would be deleted by
   retention; `inputs` has `message.timestamp.type=LogAppendTime`, the time the processor
   judges key windows and expiry at.

A broken invariant raises `TopicLayoutError` (a `ConfigError`) that names the topic, the
reason and the command that fixes it: Torpor never alters an existing topic by itself.
No broker answering before `deadline` raises `BrokerUnreachableError`. Every broker call is
bounded by the deadline; no raw `KafkaException` escapes.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

# The public names in confluent_kafka.admin are not re-exported for a type checker.
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._metadata import ClusterMetadata
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from torpor.schemas.errors import ConfigError, RetriableError
from torpor.streams.clients import check_reachable
from torpor.streams.config import Settings
from torpor.streams.deadline import Deadline
from torpor.streams.errors import BrokerUnreachableError, TopicLayoutError, kafka_error_of, translate
from torpor.streams.topics import REQUIRED, Topic, TopicNames, TopicSpec, topic_specs

# A single admin request may take this long; the caller's deadline bounds the whole.
ADMIN_CALL_SECONDS: Final = 10.0
# Between two metadata reads while new topics propagate: short, since it usually takes
# tens of milliseconds, and bounded by the deadline anyway.
_PROPAGATION_PAUSE: Final = 0.05

# Broker answers to CreateTopics that only the operator can fix, with what to change.
_CREATE_REFUSALS: Final[Mapping[int, str]] = {
    KafkaError.INVALID_REPLICATION_FACTOR: (
        "the replication factor is larger than the number of brokers alive: bring the missing "
        "brokers back, or set TORPOR_REPLICATION_FACTOR (or [topics] replication_factor) to at most "
        "the broker count"
    ),
    KafkaError.INVALID_PARTITIONS: "set TORPOR_PARTITIONS (or [topics] partitions) to a count it accepts",
    KafkaError.INVALID_CONFIG: "the broker rejected a topic config; check the broker's allowed topic configs",
    KafkaError.POLICY_VIOLATION: "a broker create-topic policy refused it; ask the cluster's operator",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "grant this principal CREATE on the topic, or create it yourself",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "grant this principal CREATE on the cluster, or create them",
}
# Metadata errors on a topic that waiting does not cure.
_NOT_ALLOWED: Final[frozenset[int]] = frozenset(
    {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED}
)


@dataclass(frozen=True, slots=True)
class TopicsEnsured:
    """What `ensure_topics` found: topics it created, topics that existed, the partition count."""

    created: tuple[str, ...]
    existing: tuple[str, ...]
    partitions: int


def ensure_topics(admin: AdminClient, settings: Settings, deadline: Deadline) -> TopicsEnsured:
    """Create the missing Torpor topics, then verify the layout (see the module docstring).

    Returns what was created and what already existed. Raises `BrokerUnreachableError`
    when no broker answers before `deadline`, `RetriableError` when new topics get no
    leader in time, `TopicLayoutError` when an existing topic breaks an invariant,
    `ConfigError` when the broker refuses to create a topic for a reason the operator must
    fix, and a translated `TorporError` otherwise.
    """
    bootstrap = settings.kafka.bootstrap_servers
    names = TopicNames.for_prefix(settings.topics.prefix)
    # 1. inputs first: an existing inputs topic, even one another instance created a moment
    #    ago, decides the partition count of every topic that follows it.
    metadata = check_reachable(admin, deadline, bootstrap_servers=bootstrap)
    created: tuple[str, ...] = ()
    brokers = _brokers_to_replicate_on(admin, settings, metadata, deadline)
    if names.inputs not in metadata.topics:
        fresh = topic_specs(settings.topics, brokers=brokers)
        created = _create(admin, [spec for spec in fresh if spec.topic is Topic.INPUTS], deadline, bootstrap)
    metadata = _await_metadata(admin, [names.inputs], deadline, bootstrap)
    # 2. the rest, shaped by the inputs as the broker has them.
    specs = topic_specs(settings.topics, brokers=brokers,
                        inputs_partitions=len(metadata.topics[names.inputs].partitions))
    missing = [spec for spec in specs if spec.name not in metadata.topics]
    created += _create(admin, missing, deadline, bootstrap)
    # 3. wait until the metadata shows them all, then check the invariants.
    metadata = _await_metadata(admin, [spec.name for spec in specs], deadline, bootstrap)
    _check_partitions(metadata, names, bootstrap)
    _check_configs(admin, names, deadline, bootstrap)
    existing = tuple(spec.name for spec in specs if spec.name not in created)
    return TopicsEnsured(
        created=created, existing=existing, partitions=len(metadata.topics[names.inputs].partitions)
    )


def _brokers_to_replicate_on(admin: AdminClient, settings: Settings, metadata: ClusterMetadata,
                             deadline: Deadline) -> int:
    """The broker count the replication of new topics follows (`topics.replication_for`).

    The brokers alive now, or the cluster's own `default.replication.factor` when that is
    larger: a broker down for maintenance while the topics are made must not leave them
    with fewer copies for good. A KRaft controller places a replica on a broker it fenced
    but still has registered (in sync once it is back); with too few registered brokers the
    create is refused, naming the fix. Only asked when `TORPOR_REPLICATION_FACTOR` leaves
    it to the cluster.
    """
    alive = len(metadata.brokers)
    if settings.topics.replication_factor is not None or not metadata.brokers:
        return max(alive, 1)
    broker = str(min(metadata.brokers))
    configured = _describe_configs(admin, [broker], deadline, settings.kafka.bootstrap_servers,
                                   ResourceType.BROKER)[broker].get("default.replication.factor")
    return max(alive, int(configured)) if configured and configured.isdigit() else alive


def _create(
    admin: AdminClient, specs: Sequence[TopicSpec], deadline: Deadline, bootstrap: str
) -> tuple[str, ...]:
    """Create `specs`; returns the names this call created (not those a racing instance did)."""
    if not specs:
        return ()
    timeout = deadline.timeout_for_call(ADMIN_CALL_SECONDS)
    new_topics = [
        NewTopic(
            spec.name,
            num_partitions=spec.partitions,
            replication_factor=spec.replication_factor,
            config=dict(spec.config),
        )
        for spec in specs
    ]
    try:
        futures = admin.create_topics(new_topics, request_timeout=timeout, operation_timeout=timeout)
    except KafkaException as exc:
        raise translate(exc, operation="create_topics") from exc
    created: list[str] = []
    for name, future in futures.items():
        try:
            # librdkafka resolves the future by request_timeout; the margin only covers its bookkeeping.
            future.result(timeout=timeout + 1.0)
        except concurrent.futures.TimeoutError:
            raise BrokerUnreachableError(bootstrap, timeout, f"creating {name} got no answer") from None
        except KafkaException as exc:
            error = kafka_error_of(exc)
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue  # another instance created it between our metadata read and now
            if error.code() in _CREATE_REFUSALS:
                raise ConfigError(
                    f"the broker at {bootstrap} refused to create topic {name}: {error.str()}. "
                    f"{_CREATE_REFUSALS[error.code()]}."
                ) from exc
            raise translate(exc, operation=f"create topic {name}") from exc
        created.append(name)
    return tuple(created)


def _await_metadata(
    admin: AdminClient, names: Sequence[str], deadline: Deadline, bootstrap: str
) -> ClusterMetadata:
    """Wait until every topic in `names` shows in the metadata with a leader on each partition."""
    while True:
        metadata = check_reachable(admin, deadline, bootstrap_servers=bootstrap)
        for name in names:
            topic = metadata.topics.get(name)
            if topic is not None and topic.error is not None and topic.error.code() in _NOT_ALLOWED:
                raise ConfigError(
                    f"this client may not see topic {name} at {bootstrap}: {topic.error.str()}. "
                    "Grant its principal DESCRIBE (and CREATE) on the Torpor topics."
                )
        pending = [name for name in names if not topic_ready(metadata, name)]
        if not pending:
            return metadata
        if deadline.expired():
            raise RetriableError(
                f"topics {', '.join(pending)} at {bootstrap} still have no leader on every partition at the "
                "deadline: retry with a longer deadline, or check the broker's log"
            )
        time.sleep(min(_PROPAGATION_PAUSE, deadline.remaining()))


def topic_ready(metadata: ClusterMetadata, name: str) -> bool:
    """`name` exists and every one of its partitions has a leader: clients can use it."""
    topic = metadata.topics.get(name)
    return (
        topic is not None
        and topic.error is None
        and bool(topic.partitions)
        and all(partition.leader >= 0 for partition in topic.partitions.values())
    )


def _check_partitions(metadata: ClusterMetadata, names: TopicNames, bootstrap: str) -> None:
    inputs = len(metadata.topics[names.inputs].partitions)
    changelog = len(metadata.topics[names.changelog].partitions)
    if changelog == inputs:
        return
    why = (
        f"topic {names.changelog} has {changelog} partitions but {names.inputs} has {inputs}; they must "
        f"match, because the store of inputs partition N is restored from changelog partition N."
    )
    if changelog < inputs:
        fix = (
            f"Grow the changelog to match: kafka-topics.sh --bootstrap-server {bootstrap} --alter "
            f"--topic {names.changelog} --partitions {inputs}"
        )
    else:
        fix = (
            f"The changelog has more partitions than the inputs, which Kafka cannot shrink. Grow "
            f"{names.inputs} to {changelog} partitions (kafka-topics.sh --bootstrap-server {bootstrap} "
            f"--alter --topic {names.inputs} --partitions {changelog}; this moves some threads to other "
            f"partitions, so do it only before any input was written), or use a fresh TORPOR_TOPIC_PREFIX."
        )
    raise TopicLayoutError(f"{why} {fix}")


def _check_configs(admin: AdminClient, names: TopicNames, deadline: Deadline, bootstrap: str) -> None:
    """Every `topics.REQUIRED` config holds on the broker's topics (existing ones included)."""
    topics = list(dict.fromkeys(required.topic for required in REQUIRED))
    described = _describe_configs(admin, [names.of(topic) for topic in topics], deadline, bootstrap)
    for required in REQUIRED:
        name = names.of(required.topic)
        value = described[name].get(required.key)
        if value != required.value:
            raise TopicLayoutError(
                f"topic {name} has {required.key}={value!r} but must be {required.value!r}: "
                f"{required.why}. Fix: kafka-configs.sh --bootstrap-server {bootstrap} --alter "
                f"--entity-type topics --entity-name {name} --add-config {required.key}={required.value}"
            )


def _describe_configs(admin: AdminClient, names: Sequence[str], deadline: Deadline, bootstrap: str,
                      kind: ResourceType = ResourceType.TOPIC) -> dict[str, dict[str, str | None]]:
    """Each topic (or broker id) of `names` with its configs (key -> value, None when none is given).

    On a cluster the broker answering may not know a topic the metadata already showed
    (it propagates to each broker in turn): such a topic is asked again until `deadline`.
    """
    described: dict[str, dict[str, str | None]] = {}
    pending = list(names)
    while pending:
        unknown = _describe_configs_once(admin, pending, deadline, bootstrap, kind, described)
        if not unknown:
            break
        if deadline.expired():
            raise RetriableError(
                f"topics {', '.join(unknown)} at {bootstrap} are still unknown to the broker describing "
                "their configs at the deadline: retry with a longer deadline"
            )
        time.sleep(min(_PROPAGATION_PAUSE, deadline.remaining()))
        pending = unknown
    return described


def _describe_configs_once(admin: AdminClient, names: Sequence[str], deadline: Deadline, bootstrap: str,
                           kind: ResourceType, described: dict[str, dict[str, str | None]]) -> list[str]:
    """Describe `names` into `described`; returns the topics the answering broker did not know yet."""
    resources = {name: ConfigResource(kind, name) for name in names}
    timeout = deadline.timeout_for_call(ADMIN_CALL_SECONDS)
    try:
        futures = admin.describe_configs(list(resources.values()), request_timeout=timeout)
    except KafkaException as exc:
        raise translate(exc, operation="describe_configs") from exc
    unknown: list[str] = []
    for name, resource in resources.items():
        try:
            entries = futures[resource].result(timeout=timeout + 1.0)
        except concurrent.futures.TimeoutError:
            raise BrokerUnreachableError(bootstrap, timeout, f"describing {name} got no answer") from None
        except KafkaException as exc:
            if kafka_error_of(exc).code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                unknown.append(name)
                continue
            raise translate(exc, operation=f"describe configs of {name}") from exc
        described[name] = {key: entry.value for key, entry in entries.items()}
    return unknown


@dataclass(frozen=True, slots=True)
class TopicState:
    """One Torpor topic as the broker has it, against the layout (`torpor topics check`).

    `partitions` and `config` are None when the topic does not exist. `problems` must be
    fixed (the processor refuses to start, or would act on a wrong layout); `drift` lists
    configs (and a replication factor) that differ from the layout but break no invariant
    (a retention an operator chose, a topic made before the cluster grew).
    """

    spec: TopicSpec
    partitions: int | None
    config: Mapping[str, str] | None
    problems: tuple[str, ...]
    drift: tuple[str, ...]


def inspect_topics(admin: AdminClient, settings: Settings, deadline: Deadline) -> tuple[TopicState, ...]:
    """Every Torpor topic of `settings` as it exists, with what breaks the layout. Creates nothing."""
    bootstrap = settings.kafka.bootstrap_servers
    metadata = check_reachable(admin, deadline, bootstrap_servers=bootstrap)
    names = TopicNames.for_prefix(settings.topics.prefix)
    inputs = metadata.topics.get(names.inputs)
    brokers = _brokers_to_replicate_on(admin, settings, metadata, deadline)
    specs = topic_specs(settings.topics, brokers=brokers,
                        inputs_partitions=None if inputs is None else len(inputs.partitions))
    present = [spec for spec in specs if spec.name in metadata.topics]
    described = {name: {key: str(value) for key, value in config.items()}
                 for name, config in _describe_configs(admin, [spec.name for spec in present], deadline,
                                                       bootstrap).items()}
    required = {(r.topic, r.key): r for r in REQUIRED}
    found: list[TopicState] = []
    for spec in specs:
        if spec.name not in metadata.topics:
            found.append(TopicState(spec, None, None, ("missing",), ()))
            continue
        partitions = len(metadata.topics[spec.name].partitions)
        config = described[spec.name]
        problems: list[str] = []
        drift: list[str] = []
        if partitions != spec.partitions:
            problems.append(f"{partitions} partitions, the layout needs {spec.partitions}")
        copies = min(len(p.replicas) for p in metadata.topics[spec.name].partitions.values())
        if copies != spec.replication_factor:
            drift.append(f"{copies} replicas (the layout says {spec.replication_factor})")
        for key, wanted in spec.config.items():
            actual = config.get(key)
            if actual == wanted:
                continue
            rule = required.get((spec.topic, key))
            if rule is not None:
                problems.append(f"{key}={actual!r}, must be {wanted!r}: {rule.why}")
            else:
                drift.append(f"{key}={actual!r} (the layout says {wanted!r})")
        found.append(TopicState(spec, partitions, config, tuple(problems), tuple(drift)))
    return tuple(found)
