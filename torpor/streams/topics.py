"""The Torpor topics: their names and the layout each must have (DESIGN.md, section 3).

Contract: `TopicNames.for_prefix(prefix)` names the seven topics, and `topic_specs(settings,
brokers=...)` returns one `TopicSpec` per topic from the `LAYOUTS` table: partition count,
replication factor and the topic configs that `admin.ensure_topics` creates them with. Every
retention is set explicitly, so the behaviour never depends on the broker's defaults.

Replication follows the cluster (`replication_for`): unless `TORPOR_REPLICATION_FACTOR`
sets it, a topic gets as many copies as there are brokers, up to three (one on a laptop
broker, three on a production cluster), and `min.insync.replicas` one fewer than that,
so a write acknowledged by acks=all survives the loss of any one broker and writes go on
while one is down.

Two invariants the processor relies on, checked again on existing topics by
`admin.ensure_topics`: the changelog has exactly as many partitions as `inputs` (store
partition N is restored from changelog partition N), and the changelog is compacted (only
the latest value of each store key is kept, and nothing live is ever deleted).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Final

from torpor.streams.config import TopicSettings

_DAY_MS: Final = 24 * 60 * 60 * 1000
# Kafka's "keep forever" for retention.ms; it is the broker's own spelling, not ours.
_FOREVER: Final = "-1"


class Topic(StrEnum):
    """The seven topics; the value is the suffix after the prefix."""

    INPUTS = "inputs"
    OUTBOX = "outbox"
    EVENTS = "events"
    RECEIPTS = "receipts"
    CHANGELOG = "changelog"
    PARKED = "parked"
    TOOLSETS = "toolsets"


class PartitionRule(Enum):
    """How many partitions a topic gets."""

    LIKE_INPUTS = "like_inputs"  # keyed by thread id (or store key): one partition per input partition
    ONE = "one"  # a small catalogue read whole


@dataclass(frozen=True, slots=True)
class Layout:
    """How one topic is laid out, before a prefix or a partition count is known."""

    partitions: PartitionRule
    config: Mapping[str, str]
    why: str


LAYOUTS: Final[Mapping[Topic, Layout]] = {
    Topic.INPUTS: Layout(
        PartitionRule.LIKE_INPUTS,
        {"cleanup.policy": "delete", "retention.ms": _FOREVER, "retention.bytes": "-1",
         "message.timestamp.type": "LogAppendTime"},
        "the source of truth: re-folding it rebuilds every thread, so nothing may expire",
    ),
    Topic.OUTBOX: Layout(
        PartitionRule.LIKE_INPUTS,
        {"cleanup.policy": "delete", "retention.ms": str(7 * _DAY_MS)},
        "connectors consume dispatches promptly; a week covers a connector down over a long weekend",
    ),
    Topic.EVENTS: Layout(
        PartitionRule.LIKE_INPUTS,
        {"cleanup.policy": "delete", "retention.ms": str(1 * _DAY_MS)},
        "a live feed for observers (model deltas included); history is durable in the store, "
        "so a day lets a UI catch up after a restart without keeping every delta",
    ),
    Topic.RECEIPTS: Layout(
        PartitionRule.LIKE_INPUTS,
        {"cleanup.policy": "delete", "retention.ms": _FOREVER, "retention.bytes": "-1"},
        "the audit trail, one receipt per input: kept as long as the inputs it accounts for",
    ),
    Topic.CHANGELOG: Layout(
        PartitionRule.LIKE_INPUTS,
        {"cleanup.policy": "compact"},
        "the store's replica: compacted to the latest value per key, restored partition for partition",
    ),
    Topic.PARKED: Layout(
        PartitionRule.LIKE_INPUTS,
        {"cleanup.policy": "delete", "retention.ms": str(30 * _DAY_MS)},
        "work waiting for an operator: a month to notice, look and replay it",
    ),
    Topic.TOOLSETS: Layout(
        PartitionRule.ONE,
        {"cleanup.policy": "compact"},
        "a small catalogue keyed by toolset name, read whole by clients: compacted, one partition",
    ),
}


@dataclass(frozen=True, slots=True)
class Required:
    """A config an existing topic must have too (`admin.ensure_topics` checks it), and why."""

    topic: Topic
    key: str
    value: str
    why: str


REQUIRED: Final[tuple[Required, ...]] = (
    Required(Topic.INPUTS, "message.timestamp.type", "LogAppendTime",
             "the processor judges key windows and input expiry at the time the broker appended "
             "the input, which no writer chooses (a signer could back-date its own created_at)"),
    Required(Topic.CHANGELOG, "cleanup.policy", "compact",
             "it replicates the store, and deleting old segments would lose live rows"),
    Required(Topic.TOOLSETS, "cleanup.policy", "compact", LAYOUTS[Topic.TOOLSETS].why),
)


# Three copies is what production runs: one broker may be lost, a second may be down for
# maintenance meanwhile. More copies cost disk and produce latency for little gain.
MAX_DEFAULT_REPLICAS: Final = 3


@dataclass(frozen=True, slots=True)
class Replication:
    """How many copies a topic keeps, and how many must hold a record before acks=all answers."""

    factor: int
    min_insync: int


def replication_for(brokers: int, factor: int | None = None) -> Replication:
    """The replication of new topics on a cluster of `brokers`; `factor` overrides the count.

    Without `factor`: `min(brokers, 3)` copies. `min_insync` is a majority of the copies
    but never all of them (one broker down must not stop the writes), and at least one:
    1 copy -> 1, 2 -> 1, 3 -> 2, 4 -> 3, 5 -> 3.
    """
    if brokers < 1:
        raise ValueError(f"a cluster has at least one broker, got {brokers}")
    copies = min(brokers, MAX_DEFAULT_REPLICAS) if factor is None else factor
    return Replication(factor=copies, min_insync=max(1, min(copies - 1, copies // 2 + 1)))


@dataclass(frozen=True, slots=True)
class TopicNames:
    """The full name of each Torpor topic under one prefix."""

    inputs: str
    outbox: str
    events: str
    receipts: str
    changelog: str
    parked: str
    toolsets: str

    @classmethod
    def for_prefix(cls, prefix: str) -> TopicNames:
        return cls(**{topic.value: f"{prefix}{topic.value}" for topic in Topic})

    def of(self, topic: Topic) -> str:
        """The full name of `topic`."""
        name: str = getattr(self, topic.value)
        return name

    def all(self) -> tuple[str, ...]:
        return tuple(self.of(topic) for topic in Topic)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic as it must be created: name, partitions, replication factor and configs."""

    topic: Topic
    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, str]


def topic_specs(settings: TopicSettings, *, brokers: int,
                inputs_partitions: int | None = None) -> tuple[TopicSpec, ...]:
    """One spec per topic, in `Topic` order, for a cluster of `brokers` (`replication_for`).

    `inputs_partitions` is the partition count `inputs` already has on the broker, when it
    exists: the topics that follow `inputs` must match it, whatever `settings.partitions`
    says now (the setting only applies to a fresh `inputs`).
    """
    names = TopicNames.for_prefix(settings.prefix)
    like_inputs = settings.partitions if inputs_partitions is None else inputs_partitions
    replication = replication_for(brokers, settings.replication_factor)
    return tuple(
        TopicSpec(
            topic=topic,
            name=names.of(topic),
            partitions=like_inputs if layout.partitions is PartitionRule.LIKE_INPUTS else 1,
            replication_factor=replication.factor,
            config={**layout.config, "min.insync.replicas": str(replication.min_insync)},
        )
        for topic, layout in LAYOUTS.items()
    )
