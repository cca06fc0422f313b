"""The operator's desk: what the page's buttons produce, before any broker sees it.

A decision and a command are the inputs `torpor approve` and `torpor control` make, as
`operator:<name>`, signed with the UI's key so a processor's key ring verifies them;
a decision made twice is the same message (a duplicate for the fold); a request the
processor would refuse is refused here, and nothing is produced.
"""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from torpor.inspector.desk import Desk, DeskError
from torpor.schemas import signing
from torpor.schemas.keyring import KeyRing, KeyVersion
from torpor.schemas.records import ApprovalDecision, Control, Input
from torpor.schemas.signer import Signer, public_key_bytes


def _desk(sent: list[Input], signed: bool = True) -> tuple[Desk, KeyRing]:
    key = Ed25519PrivateKey.generate()
    ring = KeyRing((KeyVersion("ops-1", public_key_bytes(key), ("operator:*",)),))
    return Desk("alice", Signer("ops-1", key) if signed else None, sent.append), ring


def test_an_approval_from_the_page_is_a_signed_operator_decision_and_twice_is_one_message() -> None:
    sent: list[Input] = []
    desk, ring = _desk(sent)
    first = desk.approve("agent-1", "approval-1", "approve")
    again = desk.approve("agent-1", "approval-1", "approve")
    assert first == again and [r.message_id for r in sent] == [first, first]
    record = sent[0]
    assert record.source == "operator:alice" and record.thread_id == "agent-1"
    assert record.body == ApprovalDecision(approval_id="approval-1", choice="approve",
                                           decided_by="operator:alice")
    assert signing.verify(record, ring).is_verified


def test_a_control_from_the_page_is_signed_and_carries_its_reason() -> None:
    sent: list[Input] = []
    desk, ring = _desk(sent)
    desk.control("agent-1", "cancel_call", call_id="call-1", reason="<b>why</b>")
    assert sent[0].body == Control(command="cancel_call", call_id="call-1", model=None, reason="<b>why</b>")
    assert signing.verify(sent[0], ring).is_verified
    desk.control("agent-1", "stop")
    assert sent[1].message_id != sent[0].message_id


def test_without_a_key_the_desk_sends_unsigned_which_a_key_ring_refuses() -> None:
    sent: list[Input] = []
    desk, ring = _desk(sent, signed=False)
    desk.control("agent-1", "stop")
    assert sent[0].signature is None and not signing.verify(sent[0], ring).is_verified


@pytest.mark.parametrize(("thread", "command", "fields"), [
    ("agent-1", "delete", {}),
    ("agent-1", "cancel_call", {}),
    ("agent-1", "stop", {"call_id": "call-1"}),
    ("agent-1", "set_model", {}),
    ("a b", "stop", {}),
    ("\ud800", "stop", {}),
    ("agent-1", "stop", {"reason": "x" * 1001}),
    ("agent-1", "stop", {"reason": "\udfff"}),
    ("agent-1", "cancel_call", {"call_id": "<script>"}),
])
def test_a_request_the_processor_would_refuse_is_refused_before_anything_is_sent(
        thread: str, command: str, fields: dict[str, str]) -> None:
    sent: list[Input] = []
    desk, _ = _desk(sent)
    with pytest.raises(DeskError):
        desk.control(thread, command, **fields)
    with pytest.raises(DeskError):
        desk.approve(thread if command == "delete" else "agent-1", "approval 1", "approve")
    assert sent == []
