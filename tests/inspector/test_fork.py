"""The page's "fork from here": the desk's `fork` control and `POST /api/fork`, before any broker.

The desk sends the control `torpor fork` sends, signed as the operator, and answers the
new thread's id and its creation's message id (the fold derives the same one); a request
the processor would refuse is refused here and nothing is produced. The route needs the
page's token like every action, and refuses a body that is not a fork request with 400.
"""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.testclient import TestClient

from torpor.inspector.app import UiConfig, create_app
from torpor.inspector.desk import Desk, DeskError
from torpor.schemas import signing
from torpor.schemas.ids import MAX_ID_LENGTH, fork_creation_id, id_problem
from torpor.schemas.keyring import KeyRing, KeyVersion
from torpor.schemas.records import Control, Input
from torpor.schemas.signer import Signer, public_key_bytes
from torpor.streams.config import Settings


def _desk(sent: list[Input]) -> tuple[Desk, KeyRing]:
    key = Ed25519PrivateKey.generate()
    ring = KeyRing((KeyVersion("ops-1", public_key_bytes(key), ("operator:*",)),))
    return Desk("alice", Signer("ops-1", key), sent.append), ring


def test_a_fork_from_the_page_is_a_signed_operator_control_naming_its_new_thread() -> None:
    sent: list[Input] = []
    desk, ring = _desk(sent)
    asked = desk.fork("agent-1", 3, new_thread_id="agent-1-try", model="openai:other", reason="another model")
    [record] = sent
    assert record.message_id == asked.message_id and record.thread_id == "agent-1"
    assert record.source == "operator:alice" and signing.verify(record, ring).is_verified
    assert record.body == Control(command="fork", call_id=None, model="openai:other", reason="another model",
                                  new_thread_id="agent-1-try", at_seq=3)
    assert asked.new_thread_id == "agent-1-try"
    assert asked.creation_id == fork_creation_id(record.message_id, "agent-1-try")


def test_without_a_new_id_the_desk_makes_one_that_stays_a_wire_id() -> None:
    sent: list[Input] = []
    desk, _ = _desk(sent)
    for thread in ("agent-1", "a" * MAX_ID_LENGTH):
        asked = desk.fork(thread, 0)
        assert asked.new_thread_id != thread and id_problem(asked.new_thread_id) is None
        assert asked.new_thread_id.startswith(thread[:200]) and "-fork-" in asked.new_thread_id
    assert desk.fork("agent-1", 0).new_thread_id != desk.fork("agent-1", 0).new_thread_id


@pytest.mark.parametrize(("thread", "at_seq", "fields"), [
    ("agent-1", -1, {}),
    ("agent-1", 2**63, {}),
    ("agent-1", True, {}),
    ("agent-1", "1", {}),
    ("agent-1", 0, {"new_thread_id": "has space"}),
    ("agent-1", 0, {"new_thread_id": "x" * 300}),
    ("agent-1", 0, {"new_thread_id": "agent-1"}),
    ("agent-1", 0, {"new_thread_id": "\ud800"}),
    ("agent-1", 0, {"model": "m" * 2_000}),
    ("a b", 0, {}),
])
def test_a_fork_the_processor_would_refuse_is_refused_before_anything_is_sent(
        thread: str, at_seq: object, fields: dict[str, str]) -> None:
    sent: list[Input] = []
    desk, _ = _desk(sent)
    with pytest.raises(DeskError):
        desk.fork(thread, at_seq, **fields)  # type: ignore[arg-type]
    assert sent == []


def test_the_fork_route_needs_the_token_and_answers_the_new_thread() -> None:
    sent: list[Input] = []
    desk, _ = _desk(sent)
    config = UiConfig(settings=Settings(), desk=desk, hosts=("testserver",))
    with TestClient(create_app(config, feed=False)) as client:
        body = {"thread_id": "agent-1", "at_seq": 2, "new_thread_id": "agent-1-b", "model": ""}
        assert client.post("/api/fork", json=body).status_code == 403
        token = {"X-Torpor-Token": config.token}
        for bad in ({**body, "at_seq": "2"}, {**body, "at_seq": 2.5}, {**body, "at_seq": None},
                    {**body, "at_seq": -3}, {**body, "new_thread_id": "agent-1"}, {**body, "thread_id": 7}):
            refused = client.post("/api/fork", json=bad, headers=token)
            assert refused.status_code == 400, (bad, refused.text)
        assert sent == []
        done = client.post("/api/fork", json=body, headers=token)
        assert done.status_code == 200, done.text
        answer = done.json()
        [record] = sent
        assert answer["message_id"] == record.message_id and answer["new_thread_id"] == "agent-1-b"
        assert answer["creation_id"] == fork_creation_id(record.message_id, "agent-1-b")
        assert isinstance(record.body, Control) and record.body.model is None and record.body.at_seq == 2
