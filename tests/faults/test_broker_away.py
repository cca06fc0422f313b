"""A broker that goes away under a running processor and connector, and comes back (issue 19).

Each service says once that the broker is unreachable and once that it is back, instead
of librdkafka's lines per client and connection, and both make progress again: a
conversation started after the restart gets its echo call answered and ends.
"""

from __future__ import annotations

import re
import signal
import uuid
from pathlib import Path

import pytest

from tests.faults.own_broker import OwnBroker
from tests.processors.test_processor import TORPOR, Deployment, _conversation
from tests.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

UNREACHABLE = re.compile(r"broker at (\S+) unreachable since \d\d:\d\d:\d\d \(.+\); retrying")
BACK = re.compile(r"broker at (\S+) reachable again after \d+s")


def _logs(deployment: Deployment) -> str:
    return "".join(f"{name} log:\n{deployment.log(name)[-3000:]}\n" for name in ("processor", "echo"))


def test_a_broker_stopped_and_restarted_is_said_once_each_way_and_the_services_go_on(
        own_broker: OwnBroker, tmp_path: Path) -> None:
    deployment = Deployment(own_broker.bootstrap, tmp_path)
    try:
        processor = deployment.start(deployment.processor_args(), "processor")  # creates the topics
        echo = deployment.start([TORPOR, "connector", "run-echo", "--group", f"echo-{deployment.prefix}",
                                 "--journal-dir", str(tmp_path / "journal")], "echo")
        before = f"before-{uuid.uuid4().hex[:6]}"
        deployment.send(*_conversation(before, "please ping"))
        wait_until(lambda: "The echo said ping." in deployment.answers(before), 120,
                   lambda: f"a thread ends first; {_logs(deployment)}")

        own_broker.stop()
        for name in ("processor", "echo"):
            wait_until(lambda n=name: UNREACHABLE.search(deployment.log(n)), 120,  # type: ignore[misc]
                       f"the {name} says the broker is unreachable")
        own_broker.restart(topic=deployment.topic("inputs"))
        for name in ("processor", "echo"):
            wait_until(lambda n=name: BACK.search(deployment.log(n)), 120,  # type: ignore[misc]
                       f"the {name} says the broker is back")

        after = f"after-{uuid.uuid4().hex[:6]}"
        deployment.send(*_conversation(after, "please ping"))
        wait_until(lambda: "The echo said ping." in deployment.answers(after), 240,
                   lambda: f"a thread ends after the restart; {_logs(deployment)}")
        for process in (processor, echo):
            assert process.poll() is None
            process.send_signal(signal.SIGTERM)
        assert echo.wait(timeout=60) == 0, deployment.log("echo")[-3000:]
        assert processor.wait(timeout=60) == 0, deployment.log("processor")[-3000:]
    finally:
        deployment.stop_all()
    for name in ("processor", "echo"):
        log = deployment.log(name)
        down = UNREACHABLE.findall(log)
        back = BACK.findall(log)
        # One line each way per broker address (one broker here), whatever the clients.
        assert down == [own_broker.bootstrap] and back == [own_broker.bootstrap], log[-4000:]
        assert "Connect to" not in log and "Disconnected" not in log, log[-4000:]
        assert "Traceback" not in log, log[-4000:]
