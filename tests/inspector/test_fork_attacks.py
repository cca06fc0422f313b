"""`POST /api/fork` and `/api/control` driven to fork what the operator did not ask for
(helper-21's review of issue 20), before any broker.

Each request carries the page's token unless it says otherwise, so what stands between it
and the operator's key is the route's own checks: fields that would name who asks or
where the history comes from, a fork smuggled through `/api/control`, another origin or
host, ids and text with control characters. Nothing reaches `submit` for any of them.
"""

from __future__ import annotations

import json

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.testclient import TestClient

from torpor.inspector.app import UiConfig, create_app
from torpor.inspector.desk import Desk
from torpor.schemas.records import Control, Input
from torpor.schemas.signer import Signer
from torpor.streams.config import Settings

GOOD = {"thread_id": "agent-1", "at_seq": 2, "new_thread_id": "agent-1-b"}


def _app(sent: list[Input]) -> tuple[TestClient, dict[str, str]]:
    desk = Desk("alice", Signer("ops-1", Ed25519PrivateKey.generate()), sent.append)
    config = UiConfig(settings=Settings(), desk=desk, hosts=("testserver",))
    return TestClient(create_app(config, feed=False)), {"X-Torpor-Token": config.token}


def test_a_fork_request_naming_who_asks_or_what_is_inherited_is_refused_whole() -> None:
    sent: list[Input] = []
    client, token = _app(sent)
    with client:
        extras: list[dict[str, object]] = [
            {"source": "operator:root"}, {"requested_by": "operator:root"}, {"key_id": "proc-1"},
            {"signature": "AA=="}, {"fork": {"source_thread_id": "x"}}, {"inherited": []}, {"config": {}},
            {"command": "delete"}, {"message_id": "m-1"}, {"created_at": 0}, {"control_id": "m-0"}]
        for extra in extras:
            refused = client.post("/api/fork", json={**GOOD, **extra}, headers=token)
            assert refused.status_code == 400, (extra, refused.text)
            assert "unexpected field" in refused.json()["error"]
        assert sent == []


def test_a_fork_cannot_be_smuggled_through_the_control_route() -> None:
    sent: list[Input] = []
    client, token = _app(sent)
    with client:
        for body in ({"thread_id": "agent-1", "command": "fork"},
                     {"thread_id": "agent-1", "command": "fork", "new_thread_id": "x", "at_seq": 0},
                     {"thread_id": "agent-1", "command": "delete"},
                     {"thread_id": "agent-1", "command": "stop\n"}):
            refused = client.post("/api/control", json=body, headers=token)
            assert refused.status_code == 400, (body, refused.text)
        assert sent == []


def test_a_fork_from_another_origin_or_host_or_without_the_token_is_refused() -> None:
    sent: list[Input] = []
    client, token = _app(sent)
    with client:
        for headers, status in (({}, 403), ({"X-Torpor-Token": token["X-Torpor-Token"] + "x"}, 403),
                                ({**token, "Origin": "http://evil.example"}, 403),
                                ({**token, "Origin": "null"}, 403),
                                ({**token, "Origin": "http://testserver.evil.example"}, 403),
                                ({**token, "Host": "evil.example"}, 400)):
            refused = client.post("/api/fork", json=GOOD, headers=headers)
            assert refused.status_code == status, (headers, refused.text)
        # A simple (form-encoded) cross-site POST carries no JSON type: refused before it is read.
        form = client.post("/api/fork", content=json.dumps(GOOD).encode(),
                           headers={**token, "Content-Type": "text/plain"})
        assert form.status_code == 415
        assert sent == []
        done = client.post("/api/fork", json=GOOD, headers={**token, "Origin": "http://testserver"})
        assert done.status_code == 200, done.text
        [record] = sent
        assert record.source == "operator:alice" and isinstance(record.body, Control)
        body = record.body
        assert (body.command, body.new_thread_id, body.at_seq) == ("fork", "agent-1-b", 2)


def test_ids_and_text_with_control_characters_or_overlong_never_reach_the_key() -> None:
    sent: list[Input] = []
    client, token = _app(sent)
    with client:
        for bad in ({"thread_id": "agent-1\n"}, {"thread_id": "agent-1\x1b[2J"},
                    {"new_thread_id": "b\r\nX: y"}, {"new_thread_id": "tp_x\x00"},
                    {"model": "m\x1b]0;pwned\x07"}, {"reason": "r\x00"},
                    {"model": "m" * 1_001}, {"at_seq": 2**63}, {"at_seq": 1e3}, {"new_thread_id": ["a"]}):
            refused = client.post("/api/fork", json={**GOOD, **bad}, headers=token)
            assert refused.status_code == 400, (bad, refused.text)
        assert sent == []
