"""The page's action endpoints (`POST /api/approve`, `/api/control`) against an attacker.

`torpor ui` as a process, beside a processor and the deploy connector, on a real broker.
Each request below carries the page's own token, so only the checks of what it asks
stand between it and the operator's key: an empty thread id, a 300 KB one, control
characters, text that is not UTF-8, a claimed operator or signer, an unknown command or
route, a body that is not a JSON object, nested too deep or too large (declared or
streamed), an action on a thread no record names. Each gets one clear refusal (a 4xx
status and a reason), nothing reaches the `inputs` topic for any of them, and the server
keeps serving: a real decision afterwards is produced, once, and applied.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Final

import httpx
import pytest
from confluent_kafka.admin import AdminClient

from tests.cli.rig import start_thread
from tests.inspector.rig import Inspected, inspected, ui_log
from tests.waiting import wait_until
from torpor.schemas.codec import decode_value
from torpor.schemas.records import Input

pytestmark = pytest.mark.kafka

WAIT_S: Final = 120.0
OPERATOR: Final = "operator:inspector-test"


@pytest.fixture(scope="module")
def ui(kafka_bootstrap: str, admin: AdminClient,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspected]:
    with inspected(kafka_bootstrap, admin, tmp_path_factory.mktemp("refused")) as found:
        wait_until(lambda: httpx.get(found.url + "api/threads", timeout=30).status_code == 200,
                   timeout=WAIT_S, message=lambda: f"the ui answering; log:\n{ui_log(found)}")
        yield found


def _token(ui: Inspected) -> str:
    page = httpx.get(ui.url, timeout=30).text
    start = page.index('name="torpor-token" content="') + len('name="torpor-token" content="')
    return page[start: page.index('"', start)]


def _post(ui: Inspected, action: str, body: bytes | Iterator[bytes], **headers: str) -> httpx.Response:
    return httpx.post(ui.url + "api/" + action, content=body, timeout=60,
                      headers={"X-Torpor-Token": _token(ui), "Content-Type": "application/json", **headers})


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


def _operator_inputs(ui: Inspected) -> list[Input]:
    """Every input on the deployment's `inputs` topic from an operator, read_committed."""
    found = [decode_value(value, Input) for _, value, _ in ui.deployment.records("inputs") if value]
    return [record for record in found if record.source.startswith("operator:")]


def _waiting_thread(ui: Inspected) -> tuple[str, str]:
    """A thread that waits for an approval, and the approval's id, as the page lists them."""
    thread = f"target-{uuid.uuid4().hex[:8]}"
    start_thread(ui.deployment, thread, "please deploy to staging", "deploy")

    def listed() -> str | None:
        found = httpx.get(ui.url + "api/thread", params={"id": thread}, timeout=30)
        approvals = found.json().get("approvals", []) if found.status_code == 200 else []
        return approvals[0]["approval_id"] if approvals else None

    return thread, wait_until(listed, timeout=WAIT_S, message=f"{thread}'s approval listed")


def _refusals(thread: str, approval: str) -> list[tuple[str, str, bytes]]:
    """(what, action, body): each must be refused."""
    stop = {"thread_id": thread, "command": "stop"}
    decide = {"thread_id": thread, "approval_id": approval, "choice": "approve"}
    nowhere = f"no-such-thread-{uuid.uuid4().hex}"
    return [
        ("an empty thread id", "control", _json({**stop, "thread_id": ""})),
        ("an empty thread id", "approve", _json({**decide, "thread_id": ""})),
        ("a thread id of 300 characters", "control", _json({**stop, "thread_id": "a" * 300})),
        ("a NUL in the thread id", "control", _json({**stop, "thread_id": thread + "\x00"})),
        ("a newline in the thread id", "approve", _json({**decide, "thread_id": thread + "\nx"})),
        ("an escape sequence in the reason", "control", _json({**stop, "reason": "\x1b[2J\x1b[31mok"})),
        ("a NUL in the choice", "approve", _json({**decide, "choice": "approve\x00"})),
        ("a right-to-left override in the thread id", "control", _json({**stop, "thread_id": "a\u202eb"})),
        ("a lone surrogate in the thread id", "control", b'{"thread_id": "\\ud800", "command": "stop"}'),
        ("a lone surrogate in the reason", "control",
         _json({**stop}).replace(b"}", b', "reason": "\\udfff"}')),
        ("bytes that are not UTF-8", "control", b'{"thread_id": "\xff\xfe\xfd", "command": "stop"}'),
        ("Latin-1 text", "control",
         '{"thread_id": "t", "command": "stop", "reason": "café"}'.encode("latin-1")),
        ("a claimed operator", "control", _json({**stop, "operator": "root"})),
        ("a claimed source", "control", _json({**stop, "source": "operator:root"})),
        ("a claimed decider", "approve", _json({**decide, "decided_by": "operator:root"})),
        ("a claimed key and signature", "approve", _json({**decide, "key_id": "ops-1", "signature": "AAAA"})),
        ("an unknown command", "control", _json({**stop, "command": "delete"})),
        ("an unknown command", "control", _json({**stop, "command": "rm -rf /"})),
        ("an empty command", "control", _json({**stop, "command": ""})),
        ("no command", "control", _json({"thread_id": thread})),
        ("a number for the thread id", "control", _json({**stop, "thread_id": 7})),
        ("null for the thread id", "approve", _json({**decide, "thread_id": None})),
        ("a list for the reason", "control", _json({**stop, "reason": ["a"]})),
        ("an empty choice", "approve", _json({**decide, "choice": ""})),
        ("a choice of 5,000 characters", "approve", _json({**decide, "choice": "x" * 5000})),
        ("text, not JSON", "control", b"stop that thread"),
        ("an empty body", "control", b""),
        ("JSON null", "control", b"null"),
        ("a JSON list", "approve", b"[1, 2]"),
        ("a JSON string", "control", b'"stop"'),
        ("JSON nested 7,000 deep", "control", b"[" * 7000 + b"]" * 7000),
        ("an object nested 3,000 deep", "approve", b'{"a":' * 3000 + b"1" + b"}" * 3000),
        ("a number of 10,000 digits", "control", b'{"thread_id": ' + b"9" * 10000 + b"}"),
        ("a thread no record names", "control", _json({**stop, "thread_id": nowhere})),
        ("a thread no record names", "approve", _json({**decide, "thread_id": nowhere})),
    ]


def _unclear(response: httpx.Response) -> str | None:
    """Why `response` is not one clear refusal (a 4xx status, a short JSON reason), or None."""
    if not 400 <= response.status_code < 500:
        return f"status {response.status_code}: {response.text[:200]}"
    try:
        error = response.json().get("error")
    except ValueError:
        return f"not JSON: {response.text[:200]}"
    if not isinstance(error, str) or not error:
        return f"no reason: {response.text[:200]}"
    if len(response.content) > 2000:
        return f"{len(response.content)} bytes: the refusal echoes the request"
    return None


def test_each_bad_action_gets_one_clear_refusal_and_nothing_reaches_kafka(ui: Inspected) -> None:
    thread, approval = _waiting_thread(ui)
    before = _operator_inputs(ui)
    # Too large: a 300 KB thread id, a megabyte declared, a megabyte streamed without a length.
    attacks = [*_refusals(thread, approval),
               ("a thread id of 300 KB", "control", _json({"thread_id": "a" * 300_000, "command": "stop"}))]
    unclear = [(what, why) for what, action, body in attacks
               if (why := _unclear(_post(ui, action, body))) is not None]
    assert unclear == [], unclear
    assert _post(ui, "control", b" " * 1_000_000).status_code == 413
    chunks = (b" " * 65_536 for _ in range(16))
    streamed = _post(ui, "approve", chunks)
    assert streamed.status_code == 413, streamed.text[:300]
    assert "request" in streamed.json()["error"]

    # Routes and methods that are not actions (`..` is resolved by the client: an empty control).
    for method, path in (("POST", "api/delete"), ("POST", "api/approve/../control"), ("GET", "api/approve"),
                         ("PUT", "api/control"), ("POST", "api/threads")):
        response = httpx.request(method, ui.url + path, timeout=30, content=b"{}",
                                 headers={"X-Torpor-Token": _token(ui), "Content-Type": "application/json"})
        assert 400 <= response.status_code < 500, (method, path, response.status_code)
        assert response.text, (method, path)

    # Nothing was produced for any of them; the server still serves and still acts.
    assert _operator_inputs(ui) == before
    assert httpx.get(ui.url + "api/threads", timeout=30).status_code == 200
    done = _post(ui, "approve", _json({"thread_id": thread, "approval_id": approval, "choice": "approve"}))
    assert done.status_code == 200, done.text
    sent = [i for i in _operator_inputs(ui) if i not in before]
    assert [(i.thread_id, i.message_id, i.source) for i in sent] == [
        (thread, done.json()["message_id"], OPERATOR)]
    wait_until(lambda: httpx.get(ui.url + "api/thread", params={"id": thread}, timeout=30).json()["approvals"]
               == [], timeout=WAIT_S, message="the decision applied: no approval pending")
