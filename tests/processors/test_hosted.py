"""`torpor processor --connector`: a connector hosted in the processor's process, with --until-idle.

The echo connector runs inside the processor (the connector runtime on a thread of its
own). `--until-idle` must wait for it: the processor exits only once the tool has
answered and the final turn is committed, and a second run finds nothing left to do.
"""

from __future__ import annotations

import uuid

import pytest

from tests.processors.test_processor import Deployment, _assert_exactly_once, _conversation, deployment

pytestmark = pytest.mark.kafka

__all__ = ["deployment"]  # the fixture, shared with test_processor

ECHO = "torpor.connectors.echo:EchoTool"


def test_a_hosted_connector_answers_and_until_idle_waits_for_it(deployment: Deployment) -> None:
    thread_id = f"hosted-{uuid.uuid4().hex[:8]}"
    deployment.send(*_conversation(thread_id, "please ping"))
    result = deployment.run(deployment.processor_args("p0", "--until-idle", "--connector", ECHO))
    assert result.returncode == 0, result.stderr[-4000:]
    assert deployment.answers(thread_id) == ["Pinging.", "The echo said ping."]
    _assert_exactly_once(deployment)
    again = deployment.run(deployment.processor_args("p0", "--until-idle", "--connector", ECHO))
    assert again.returncode == 0, again.stderr[-4000:]
    assert deployment.answers(thread_id) == ["Pinging.", "The echo said ping."]
    _assert_exactly_once(deployment)


def test_a_connector_that_cannot_be_imported_is_a_clear_error(deployment: Deployment) -> None:
    result = deployment.run(deployment.processor_args("p0", "--until-idle", "--connector", "no.such:Thing"),
                            timeout=60)
    assert result.returncode == 1
    assert "cannot import connector 'no.such:Thing'" in result.stderr
    assert "Traceback" not in result.stderr
