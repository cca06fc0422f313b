"""`torpor topics check|create` against a real broker, and a fresh prefix that has none.

Topics exist only on purpose: the bundled broker does not auto-create them, so `send` to
a prefix no processor or `topics create` prepared ends with one line naming the missing
topic, and nothing is created behind the operator's back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from tests.conftest import wait_for_leaders
from torpor.streams.topics import TopicNames

pytestmark = pytest.mark.kafka

TORPOR: Final = str(Path(sys.executable).with_name("torpor"))


@pytest.fixture
def prefix(admin: AdminClient) -> Iterator[str]:
    found = f"topics.{uuid.uuid4().hex[:8]}."
    yield found
    names = [n for n in TopicNames.for_prefix(found).all() if n in admin.list_topics(timeout=10).topics]
    if names:
        for future in admin.delete_topics(names).values():
            future.result(timeout=30)


def _torpor(kafka_bootstrap: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORPOR_TOPIC_PREFIX": prefix, "TORPOR_PARTITIONS": "3"}
    return subprocess.run([TORPOR, *args, "--bootstrap", kafka_bootstrap], env=env, capture_output=True,
                          text=True, timeout=180, check=False)


def test_check_names_what_is_missing_and_create_makes_it(kafka_bootstrap: str, prefix: str) -> None:
    names = TopicNames.for_prefix(prefix)
    missing = _torpor(kafka_bootstrap, prefix, "topics", "check")
    assert missing.returncode == 1, missing
    assert f"{names.inputs}" in missing.stdout and "PROBLEM missing" in missing.stdout

    made = _torpor(kafka_bootstrap, prefix, "topics", "create")
    assert made.returncode == 0, made
    assert {line.split()[1] for line in made.stdout.splitlines() if line.startswith("created ")} \
        == set(names.all())
    checked = _torpor(kafka_bootstrap, prefix, "topics", "check")
    assert checked.returncode == 0, checked
    lines = {line.split()[0]: line.split()[1:] for line in checked.stdout.splitlines()}
    assert lines[names.inputs] == ["3", "ok"] and lines[names.changelog] == ["3", "ok"]
    assert lines[names.toolsets] == ["1", "ok"]


def test_check_shows_a_topic_that_breaks_the_layout_with_why(kafka_bootstrap: str, prefix: str,
                                                             admin: AdminClient) -> None:
    names = TopicNames.for_prefix(prefix)
    spec = NewTopic(names.inputs, num_partitions=3, replication_factor=1,
                    config={"message.timestamp.type": "CreateTime"})
    admin.create_topics([spec])[names.inputs].result(timeout=30)
    wait_for_leaders(admin, names.inputs, 3)  # made is not yet shown in the broker's metadata
    assert _torpor(kafka_bootstrap, prefix, "topics", "create").returncode == 1
    checked = _torpor(kafka_bootstrap, prefix, "topics", "check")
    assert checked.returncode == 1, checked
    [line] = [line for line in checked.stdout.splitlines() if line.startswith(names.inputs)]
    assert "PROBLEM message.timestamp.type='CreateTime', must be 'LogAppendTime'" in line


def test_send_to_a_prefix_without_topics_names_the_topic_and_creates_nothing(kafka_bootstrap: str,
                                                                              prefix: str,
                                                                              admin: AdminClient) -> None:
    names = TopicNames.for_prefix(prefix)
    sent = _torpor(kafka_bootstrap, prefix, "send", "t1", "hello")
    assert sent.returncode == 1, sent
    assert "Traceback" not in sent.stderr and names.inputs in sent.stderr, sent.stderr
    assert names.inputs not in admin.list_topics(timeout=10).topics


def test_tail_of_a_thread_with_nothing_to_show_says_so(kafka_bootstrap: str, prefix: str,
                                                       tmp_path: Path) -> None:
    assert _torpor(kafka_bootstrap, prefix, "topics", "create").returncode == 0
    tailed = _torpor(kafka_bootstrap, prefix, "tail", "nobody", "--no-follow", "--resume-file",
                     str(tmp_path / "tail.json"))
    assert tailed.returncode == 0 and tailed.stdout == "", tailed
    assert "nothing of thread 'nobody'" in tailed.stderr and "no such thread" in tailed.stderr, tailed.stderr
