"""Scale-out: two processor instances in one group split six partitions; one is killed -9.

The second instance joins while the first is folding (a cooperative revoke mid-stream),
then the first is killed. The survivor takes the dead instance's partitions over (after
the session timeout of its static membership, shortened here to 6 s through
`[kafka.librdkafka]`), restores their stores from the changelog into its own store
directory, re-issues the model calls that were in flight, and every conversation
completes exactly once: one decisive receipt per input, no dispatch request id twice in
the outbox (read_committed), one answer per turn. A replay of the log then matches the
changelog.

The echo connector starts only after the kill: until then no conversation can finish,
so the survivor has turns left to fold however slowly the instances start (on a loaded
machine p0 once finished every conversation before p1 joined, and p1 committed nothing).
"""

from __future__ import annotations

import re
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka.admin import AdminClient

from tests.cli.rig import tear_down
from tests.processors.test_processor import (
    TORPOR,
    Deployment,
    Tail,
    _assert_exactly_once,
    _conversation,
)
from tests.waiting import wait_until
from torpor.schemas.codec import decode_value
from torpor.schemas.records import Receipt
from torpor.streams.admin import ensure_topics
from torpor.streams.config import KafkaSettings, Settings, TopicSettings
from torpor.streams.deadline import Deadline
from torpor.streams.partitioner import partition_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SIX: Final = 6
THREADS_PER_PARTITION: Final = 2
# The broker's group.min.session.timeout.ms is 6 s by default: the least a static member
# may ask for, and what bounds how long a dead instance keeps its partitions.
CONFIG: Final = '[kafka.librdkafka]\n"session.timeout.ms" = 6000\n"heartbeat.interval.ms" = 1000\n'
# Each model turn takes 1.5 s, so conversations are still running when p1 joins and when
# p0 dies (the rules of test_processor's script answer at once).
SCRIPT: Final = """\
[thread]
id = "unused"

[[model]]
last_contains = "echo: ping"
turns = [{ text = "The echo said ping.", delay_s = 1.5 }]

[[model]]
last_contains = "ping"
turns = [{ text = "Pinging.", delay_s = 1.5, calls = [{ name = "echo", arguments = { text = "ping" } }] }]
"""


@dataclass
class SixPartitions(Deployment):
    @property
    def env(self) -> dict[str, str]:
        return {**super().env, "TORPOR_PARTITIONS": str(SIX)}

    def slow_processor(self, instance: str) -> list[str]:
        script, config = self.root / "slow.toml", self.root / "torpor.toml"
        script.write_text(SCRIPT)
        config.write_text(CONFIG)
        return [TORPOR, "processor", "--instance", instance, "--app", f"app-{self.prefix}", "--store-dir",
                str(self.root / f"stores-{instance}"), "--script", str(script), "--config", str(config)]


@pytest.fixture
def six(kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> Iterator[SixPartitions]:
    found = SixPartitions(kafka_bootstrap, tmp_path)
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
                        topics=TopicSettings(prefix=found.prefix, partitions=SIX))
    ensure_topics(admin, settings, Deadline.after(60))
    yield found
    tear_down(found, admin)


def _assignment(admin: AdminClient, group: str, inputs: str) -> dict[str, set[int]]:
    """member instance id (or member id) -> the inputs partitions it owns now."""
    description = admin.describe_consumer_groups([group])[group].result(timeout=10)
    return {(m.group_instance_id or m.member_id): {tp.partition for tp in m.assignment.topic_partitions
                                                   if tp.topic == inputs}
            for m in description.members}


def _threads() -> list[str]:
    """Two threads on each of the six partitions, so both instances have conversations."""
    found: dict[int, list[str]] = {p: [] for p in range(SIX)}
    while any(len(t) < THREADS_PER_PARTITION for t in found.values()):
        thread_id = f"scale-{uuid.uuid4().hex[:8]}"
        mine = found[partition_for(thread_id.encode(), SIX)]
        if len(mine) < THREADS_PER_PARTITION:
            mine.append(thread_id)
    return [t for threads in found.values() for t in threads]


def test_a_killed_instances_partitions_move_and_every_conversation_completes_once(
    six: SixPartitions, admin: AdminClient
) -> None:
    group, inputs = f"app-{six.prefix}", six.topic("inputs")
    first = six.start(six.slow_processor("p0"), "p0")
    wait_until(lambda: _assignment(admin, group, inputs).get("p0") == set(range(SIX)), timeout=60,
               message=lambda: f"p0 owns every partition: {six.log('p0')[-2000:]}")
    threads = _threads()
    for thread_id in threads:
        six.send(*_conversation(thread_id, "please ping slowly"))
    receipts = Tail(six.bootstrap, six.topic("receipts"))
    created = {f"{thread_id}-create" for thread_id in threads}

    def all_created() -> bool:
        receipts.count()
        return created <= {decode_value(v, Receipt).input_id for v in receipts.values}

    # On every partition, so each store p1 takes over comes from the changelog.
    wait_until(all_created, timeout=120, message="p0 has folded every thread's creation")
    # p1 joins mid-stream: p0 commits or aborts its open checkpoint on the cooperative
    # revoke (librdkafka#4059 can make that an ILLEGAL_GENERATION abort) and cancels the
    # model calls of the partitions that move; p1 restores them and re-issues the calls.
    second = six.start(six.slow_processor("p1"), "p1")

    def split() -> dict[str, set[int]] | None:
        owned = _assignment(admin, group, inputs)
        halves = sorted(len(p) for p in owned.values())
        return owned if set(owned) == {"p0", "p1"} and halves == [3, 3] else None

    owned = wait_until(split, timeout=120, message=lambda: f"p0 and p1 own three partitions each: "
                       f"{six.log('p0')[-2000:]}\n{six.log('p1')[-2000:]}")
    assert owned["p0"] | owned["p1"] == set(range(SIX))
    # Every thread has been created and asked: model calls are in flight on both.
    wait_until(lambda: receipts.count() >= 2 * len(threads), timeout=120,
               message="the creations and texts folded on both instances")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)

    wait_until(lambda: _assignment(admin, group, inputs).get("p1") == set(range(SIX)), timeout=120,
               message=lambda: f"p1 owns every partition after the kill: {six.log('p1')[-3000:]}")
    # Every conversation now waits for its echo: what is left, p1 folds.
    echo = six.start([TORPOR, "connector", "run-echo", "--group", f"echo-{six.prefix}"], "echo")
    finals = Tail(six.bootstrap, six.topic("events"))

    def all_answered() -> bool:
        done = {t for t, text in finals.answers() if text == "The echo said ping."}
        return done >= set(threads)

    wait_until(all_answered, timeout=120, message=lambda: f"every conversation finished: "
                                                          f"{six.log('p1')[-3000:]}")
    for process in (second, echo):
        process.send_signal(signal.SIGTERM)
    assert second.wait(timeout=60) == 0, six.log("p1")[-3000:]
    assert echo.wait(timeout=60) == 0, six.log("echo")[-3000:]

    answers: dict[str, list[str]] = {}
    for thread_id, text in finals.answers():
        answers.setdefault(thread_id, []).append(text)
    assert answers == {t: ["Pinging.", "The echo said ping."] for t in threads}
    _assert_exactly_once(six)
    taken = six.log("p1")
    restored = taken.count("partition restored")
    assert restored >= SIX, taken[-3000:]  # three when it joined, then p0's three
    # Both times it took over partitions p0 had folded: their stores came from the changelog.
    assert len(re.findall(r"restored \([1-9]\d* changelog records", taken)) == SIX, taken[-3000:]
    assert (six.root / "stores-p1").is_dir()
    commits = re.search(r"processor p1 stopped: (\d+) commits", taken)
    assert commits is not None and int(commits.group(1)) > 0, taken[-3000:]  # p1 folded, not only p0
    replay = six.run([TORPOR, "replay", "--no-progress"])
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert len(replay.stdout.splitlines()) == len(threads)
