"""A connector started before its topics exist: it waits, says so once, and serves once they appear.

The start-up race of issue 19: `torpor connector run-echo` on a fresh topic prefix, then
the processor (which creates the topics), then a conversation whose echo call the
connector answers. Not asked to wait, the runtime refuses in one line instead.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.processors.test_processor import TORPOR, Deployment, _conversation
from tests.waiting import wait_until
from torpor.connectors.echo import EchoTool
from torpor.connectors.journal import EffectJournal
from torpor.connectors.runtime import ConnectorRuntime
from torpor.streams.config import KafkaSettings, Settings, TopicSettings
from torpor.streams.topics import TopicNames
from torpor.streams.topicwait import MissingTopicsError

pytestmark = pytest.mark.kafka


def test_a_connector_started_before_its_topics_waits_then_answers_a_dispatch(
        kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> None:
    deployment = Deployment(kafka_bootstrap, tmp_path)
    try:
        echo = deployment.start([TORPOR, "connector", "run-echo", "--group", f"echo-{deployment.prefix}",
                                 "--journal-dir", str(tmp_path / "journal")], "echo")
        wait_until(lambda: "waiting for topics" in deployment.log("echo") or echo.poll() is not None, 60,
                   "the connector says it waits")
        assert echo.poll() is None, deployment.log("echo")
        waiting = next(line for line in deployment.log("echo").splitlines() if "waiting for topics" in line)
        for topic in ("outbox", "inputs", "toolsets"):
            assert deployment.topic(topic) in waiting
        assert kafka_bootstrap in waiting and "torpor topics create" in waiting

        processor = deployment.start(deployment.processor_args(), "processor")  # creates the topics
        wait_until(lambda: "appeared after" in deployment.log("echo"), 120,
                   f"the connector sees the topics; its log:\n{deployment.log('echo')[-2000:]}")
        thread_id = f"late-{uuid.uuid4().hex[:8]}"
        deployment.send(*_conversation(thread_id, "please ping"))
        wait_until(lambda: "The echo said ping." in deployment.answers(thread_id), 120,
                   f"the echo answered; connector log:\n{deployment.log('echo')[-2000:]}")
        for process in (processor, echo):
            process.send_signal(signal.SIGTERM)
        assert echo.wait(timeout=60) == 0, deployment.log("echo")[-3000:]
        assert processor.wait(timeout=60) == 0, deployment.log("processor")[-3000:]
        log = deployment.log("echo")
        assert log.count("waiting for topics") == 1, log
        assert "Traceback" not in log, log
    finally:
        deployment.stop_all()
        names = [n for n in TopicNames.for_prefix(deployment.prefix).all()
                 if n in admin.list_topics(timeout=10).topics]
        if names:
            for future in admin.delete_topics(names, operation_timeout=30).values():
                future.result(timeout=60)


def test_not_asked_to_wait_a_connector_names_the_missing_topics_in_one_line(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    prefix = f"test.nowait.{uuid.uuid4().hex[:8]}."
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
                        topics=TopicSettings(prefix=prefix))
    journal = EffectJournal(tmp_path / "journal")
    try:
        with pytest.raises(MissingTopicsError) as refused:
            ConnectorRuntime(settings, EchoTool, group=f"g-{prefix}", journal=journal, wait_for_topics=False)
    finally:
        journal.close()
    message = str(refused.value)
    assert "\n" not in message
    for topic in ("outbox", "inputs", "toolsets"):
        assert f"{prefix}{topic}" in message
    assert kafka_bootstrap in message and "torpor topics create" in message


def test_run_echo_with_no_wait_for_topics_exits_1_naming_them(kafka_bootstrap: str, tmp_path: Path) -> None:
    deployment = Deployment(kafka_bootstrap, tmp_path)
    done = deployment.run([TORPOR, "connector", "run-echo", "--no-wait-for-topics",
                           "--journal-dir", str(tmp_path / "journal")], timeout=60)
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and deployment.topic("outbox") in errors[0], done.stderr
    assert "Traceback" not in done.stderr
