"""`torpor fork` against a processor with a key ring (a real broker): only an operator key forks.

An unsigned fork is refused (`missing_signature`); one signed with the operator key is
applied, and the fork's creation, which the processor signs with its own key, is
`verified` on the new thread. A `CreateThread` carrying a fork written by anyone else
(signed with the operator's key, unsigned as the processor, or as a user) is refused
with one receipt each, and no such thread exists.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.inspector.test_signed import KeyedDeployment, keyed  # noqa: F401  (the fixture)
from tests.processors.test_processor import TORPOR
from tests.waiting import wait_until
from torpor.schemas import signing
from torpor.schemas.ids import fork_creation_id
from torpor.schemas.records import (
    Budgets,
    Capability,
    CreateThread,
    ForkOrigin,
    Input,
    Receipt,
    ThreadConfig,
)
from torpor.schemas.signer import load_private_key

pytestmark = pytest.mark.kafka

WAIT_S = 120.0


def _receipt(deployment: KeyedDeployment, thread: str, message_id: str) -> Receipt:
    return wait_until(lambda: next((r for r in deployment.receipts()
                                    if r.thread_id == thread and r.input_id == message_id), None),
                      timeout=WAIT_S, message=lambda: f"the receipt of {message_id}; processor log:\n"
                                              f"{deployment.log('processor')[-2000:]}")


def test_only_an_operator_key_forks_and_only_the_processor_creates_a_fork(
        keyed: KeyedDeployment, tmp_path: Path) -> None:  # noqa: F811
    thread = f"keyed-{uuid.uuid4().hex[:8]}"
    sent = keyed.run([TORPOR, "send", thread, "hello", "--new", "--model", "scripted", "--wait", "60"])
    assert sent.returncode == 0, sent.stdout + sent.stderr
    wait_until(lambda: keyed.answers(thread) == ["Hello to you."], timeout=WAIT_S, message="the answer")

    fork = f"{thread}-b"
    unsigned = keyed.run([TORPOR, "fork", thread, "--at", "0", "--as", fork, "--wait", "60"])
    assert unsigned.returncode == 1, unsigned.stdout + unsigned.stderr
    assert "rejected:unsigned (missing_signature)" in unsigned.stdout, unsigned.stdout

    key = tmp_path / "keys" / "ops-1.pem"
    signed = keyed.run([TORPOR, "fork", thread, "--at", "0", "--as", fork, "--operator", "ops",
                        "--message-id", f"{thread}-fork-1", "--signing-key-id", "ops-1", "--signing-key",
                        str(key), "--wait", "60"])
    assert signed.returncode == 0, signed.stdout + signed.stderr
    created = _receipt(keyed, fork, fork_creation_id(f"{thread}-fork-1", fork))
    assert (created.disposition, created.provenance) == ("applied", "verified"), created
    wait_until(lambda: keyed.answers(fork) == ["Hello to you."], timeout=WAIT_S, message="the fork's answer")

    # Forged creations: nobody but the processor writes a fork's CreateThread.
    config = ThreadConfig(model="scripted", system_prompt="", tools=(),
                          capability=Capability(tenant="default", tools=(), scopes=(), expires_at=None),
                          budgets=Budgets(max_turns=None, max_children=None, max_tool_retries=2,
                                          max_invalid_calls=3),
                          parent=None, context_window=100_000, compaction_threshold=0.75,
                          allow_implicit_create=False)
    body = CreateThread(config=config, inherited=(), initial=(),
                        fork=ForkOrigin(source_thread_id=thread, at_seq=-1, control_id="x",
                                        requested_by="operator:ops"))
    operator_key = load_private_key(key)
    forged = f"{thread}-forged"
    attempts = []
    for n, (source, signer) in enumerate((("processor", "ops-1"), ("processor", None), ("user:mallory", None),
                                          ("operator:ops", "ops-1"))):
        record = Input(message_id=f"forge-{n}", thread_id=forged, created_at=1, source=source,
                       expires_at=None, key_id=None, signature=None, body=body)
        if signer is not None:
            record = signing.sign(record, signer, operator_key)
        keyed.send(record)
        attempts.append(record.message_id)
    refused = [_receipt(keyed, forged, message_id) for message_id in attempts]
    assert [(r.disposition, r.reason) for r in refused] == [
        ("rejected:forged", "key_not_allowed_for_source"), ("rejected:unsigned", "missing_signature"),
        ("rejected:forged", "source_not_allowed"), ("rejected:forged", "source_not_allowed")], refused
