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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx
import pytest
from confluent_kafka.admin import AdminClient

from tests.cli.rig import answer, script, settings_of
from tests.processors.test_processor import TORPOR, Deployment
from tests.waiting import wait_until
from torpor.schemas.records import Receipt
from torpor.streams.admin import ensure_topics
from torpor.streams.deadline import Deadline
from torpor.streams.topics import TopicNames

pytestmark = pytest.mark.kafka

WAIT_S: Final = 120.0
SCRIPT: Final = script(answer("hello", "Hello to you."))


@dataclass
class KeyedDeployment(Deployment):
    """A deployment whose processes share extra environment (the key ring)."""

    extra: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**super().env, **self.extra}


@pytest.fixture
def keyed(kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> Iterator[KeyedDeployment]:
    found = KeyedDeployment(kafka_bootstrap, tmp_path, prefix=f"test.ui.{uuid.uuid4().hex[:10]}.")
    ensure_topics(admin, settings_of(found), Deadline.after(60))
    ring, keys = tmp_path / "keyring.toml", tmp_path / "keys"
    for key_id, source in (("proc-1", "processor"), ("ops-1", "operator:*")):
        made = found.run([TORPOR, "keys", "new", "--id", key_id, "--source", source, "--out-dir", str(keys),
                          "--keyring", str(ring)])
        assert made.returncode == 0, made.stderr
    found.extra = {"TORPOR_KEYRING": str(ring), "TORPOR_PROCESSOR_KEY_ID": "proc-1",
                   "TORPOR_PROCESSOR_KEY": str(keys / "proc-1.pem")}
    (tmp_path / "script.toml").write_text(SCRIPT)
    found.start([TORPOR, "processor", "--instance", "p0", "--app", f"app-{found.prefix}", "--store-dir",
                 str(tmp_path / "stores"), "--script", str(tmp_path / "script.toml")], "processor")
    try:
        yield found
    finally:
        found.stop_all()
        for future in admin.delete_topics(list(TopicNames.for_prefix(found.prefix).all()),
                                          operation_timeout=30).values():
            future.result(timeout=60)


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
                      timeout=WAIT_S, message=f"the receipt of {message_id}; processor log:\n"
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
