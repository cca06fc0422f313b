"""`torpor approve` against a real broker: a tool asks, `torpor tail` shows it, a person decides.

The deploy tool (an approval relay) runs in a connector process; the scripted model calls
it; the approval request reaches the events topic, where `torpor tail` renders it with
the command that decides it. `torpor approve` with a choice that is not offered is
refused before anything is produced; with `approve` (the thread looked up on the events
topic) the decision goes through the fold to the connector, which deploys, and the model
answers. Approving again is a duplicate of the same message, not a second decision.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka.admin import AdminClient

from tests.cli.rig import DEPLOY_RULES, DEPLOYED, deploy, script, start_thread, tailed
from tests.processors.test_processor import TORPOR, Deployment
from tests.waiting import wait_until

pytestmark = pytest.mark.kafka

DONE: Final = DEPLOYED
SCRIPT: Final = script(DEPLOY_RULES)


@pytest.fixture
def deployment(kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> Iterator[Deployment]:
    with deploy(kafka_bootstrap, admin, tmp_path, SCRIPT, "torpor.connectors.approvals:DeployTool") as found:
        yield found


def test_a_pending_approval_is_shown_and_decided_from_the_command_line(deployment: Deployment,
                                                                        tmp_path: Path) -> None:
    thread = f"agent-{uuid.uuid4().hex[:8]}"
    start_thread(deployment, thread, "please deploy to staging", "deploy")
    request = rf"approval\? +Deploy staging\? -> torpor approve (\S+) \{{approve\|reject\}} --thread {thread}"
    asked = wait_until(lambda: re.search(request, tailed(deployment, thread, tmp_path)),
                       timeout=120, message=lambda: f"the approval request; connector log:\n"
                                            f"{deployment.log('connector')[-2000:]}")
    approval_id = asked.group(1)

    refused = deployment.run([TORPOR, "approve", approval_id, "maybe"])
    assert refused.returncode != 0 and "not one of the choices" in refused.stderr, refused

    for _ in range(2):  # the second is the same message: a duplicate for the fold
        done = deployment.run([TORPOR, "approve", approval_id, "approve", "--by", "user:alice"])
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"decided {approval_id} approve")

    def finished() -> str | None:
        shown = tailed(deployment, thread, tmp_path)
        return shown if DONE in shown else None

    text = wait_until(finished,
                      timeout=120, message="the deployment and the model's answer")
    assert re.search(r"approval_decided +approval_id=\S+ choice=approve decided_by=user:alice", text), text
    assert "deploy ok: deployed staging" in text
    dispositions = re.findall(r" receipt +(\S+)", text)
    assert dispositions.count("duplicate") == 1, dispositions
    assert set(dispositions) == {"applied", "duplicate"}, dispositions
