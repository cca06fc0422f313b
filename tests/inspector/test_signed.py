"""`torpor ui` against a processor with a key ring: the page's actions carry the UI's key.

A processor with a key ring (and its own key) folds operator commands only when an
operator key signed them. A UI started with an operator key stops a thread (receipt
`applied`, provenance `verified`); a UI started without one sends the same command
unsigned, and the processor refuses it, with a receipt that says so.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import httpx
import pytest
from confluent_kafka.admin import AdminClient

from tests.processors.keyed_deployment import KeyedDeployment, keyed_processor
from tests.processors.test_processor import TORPOR, Deployment
from tests.waiting import wait_until
from torpor.schemas.records import Receipt

pytestmark = pytest.mark.kafka

WAIT_S: Final = 120.0


@pytest.fixture
def keyed(kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> Iterator[KeyedDeployment]:
    with keyed_processor(kafka_bootstrap, admin, tmp_path, f"test.ui.{uuid.uuid4().hex[:10]}.",
                         (("ops-1", "operator:*"),)) as found:
        yield found


def _ui(deployment: Deployment, name: str, *args: str) -> str:
    deployment.start([TORPOR, "ui", "--port", "0", "--operator", name, *args], f"ui-{name}")
    found = wait_until(lambda: re.search(r"torpor ui: (http://\S+/)", deployment.log(f"ui-{name}")),
                       timeout=60, message=f"ui {name}'s address")
    return found.group(1)


def _stop(url: str, thread: str) -> str:
    page = httpx.get(url, timeout=30).text
    token = re.search(r'name="torpor-token" content="([^"]+)"', page)
    assert token is not None
    done = httpx.post(url + "api/control", json={"thread_id": thread, "command": "stop"},
                      headers={"X-Torpor-Token": token.group(1)}, timeout=30)
    assert done.status_code == 200, done.text
    return str(done.json()["message_id"])


def _receipt(deployment: Deployment, message_id: str) -> Receipt:
    return wait_until(lambda: next((r for r in deployment.receipts() if r.input_id == message_id), None),
                      timeout=WAIT_S, message=lambda: f"the receipt of {message_id}; processor log:\n"
                                              f"{deployment.log('processor')[-2000:]}")


def test_the_pages_commands_are_signed_with_the_uis_key_and_refused_without_one(
        keyed: KeyedDeployment, tmp_path: Path) -> None:
    thread = f"keyed-{uuid.uuid4().hex[:8]}"
    sent = keyed.run([TORPOR, "send", thread, "hello", "--new", "--model", "scripted", "--wait", "60"])
    assert sent.returncode == 0, sent.stdout + sent.stderr

    unsigned = _receipt(keyed, _stop(_ui(keyed, "nokey"), thread))
    assert unsigned.disposition.startswith("rejected:"), unsigned
    assert unsigned.provenance != "verified", unsigned

    key = str(tmp_path / "keys" / "ops-1.pem")
    signed_url = _ui(keyed, "ops", "--signing-key-id", "ops-1", "--signing-key", key)
    assert httpx.get(signed_url + "api/whoami", timeout=30).json()["signed"] is True
    signed = _receipt(keyed, _stop(signed_url, thread))
    assert (signed.disposition, signed.provenance) == ("applied", "verified"), signed
