"""`torpor ui`'s HTTP surface, as a process against a real broker and processor.

A thread's stream, cut anywhere and resumed with the last id it gave (as a browser's
EventSource does with Last-Event-ID), shows exactly what one unbroken read shows. And
as an attacker would try it: an operator action without the page's token, from another
origin, or addressed to another host is refused; a request the processor would refuse
is refused before anything is produced; the page forbids inline script.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from confluent_kafka.admin import AdminClient

from tests.cli.rig import send, settings_of
from tests.inspector.rig import HOSTILE_TEXT, Inspected, inspected, ui_log
from tests.processors.test_processor import TORPOR, Deployment
from tests.waiting import wait_until
from torpor.streams.admin import ensure_topics
from torpor.streams.deadline import Deadline
from torpor.streams.topics import TopicNames

pytestmark = pytest.mark.kafka

WAIT_S: Final = 120.0


@dataclass(frozen=True, slots=True)
class Sse:
    event: str
    data: dict[str, Any]
    id: str | None


@pytest.fixture(scope="module")
def ui(kafka_bootstrap: str, admin: AdminClient,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inspected]:
    with inspected(kafka_bootstrap, admin, tmp_path_factory.mktemp("ui")) as found:
        wait_until(lambda: _get(found, "/api/threads").status_code == 200, timeout=WAIT_S,
                   message=lambda: f"the ui answering; log:\n{ui_log(found)}")
        yield found


def _get(ui: Inspected, path: str, **headers: str) -> httpx.Response:
    return httpx.get(ui.url.rstrip("/") + path, headers=headers, timeout=30)


def _token(ui: Inspected) -> str:
    page = _get(ui, "/").text
    start = page.index('name="torpor-token" content="') + len('name="torpor-token" content="')
    return page[start: page.index('"', start)]


def _read(ui: Inspected, thread: str, until: Callable[[list[Sse]], bool],
          last_id: str | None = None) -> list[Sse]:
    """The thread's stream from the start (or after `last_id`) until `until(messages)` holds."""
    headers = {"Last-Event-ID": last_id} if last_id is not None else {}
    got: list[Sse] = []
    with httpx.stream("GET", ui.url + "api/thread/stream", params={"id": thread}, headers=headers,
                      timeout=httpx.Timeout(30, read=WAIT_S)) as response:
        assert response.status_code == 200, response.read()
        event, data, sse_id = "message", "", None
        for line in response.iter_lines():
            if line.startswith("id: "):
                sse_id = line[4:]
            elif line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
            elif line == "" and data:
                got.append(Sse(event, json.loads(data), sse_id))
                event, data, sse_id = "message", "", None
                if until(got):
                    return got
    raise AssertionError(f"the stream ended early: {got}")


def _records(messages: list[Sse]) -> list[tuple[str, str]]:
    """Every record a client learned of, by id, in the order it learned of them."""
    seen: list[tuple[str, str]] = []
    for m in messages:
        if m.event == "snapshot":
            events = m.data["events"]
            assert isinstance(events, list)
            seen.extend(("event", e["event_id"]) for e in events)
        else:
            record = m.data["record"]
            assert isinstance(record, dict)
            seen.append(("receipt", record["receipt_id"]) if record["type"] == "Receipt"
                        else ("event", record["event_id"]))
    return seen


def _complete(events: int, receipts: int) -> Callable[[list[Sse]], bool]:
    """Whether `messages` hold `events` committed events and `receipts` receipts."""
    def done(messages: list[Sse]) -> bool:
        ids = _records(messages)
        ephemeral = sum(1 for m in messages
                        if m.event == "record" and m.data["record"].get("ephemeral"))
        return (sum(1 for kind, _ in ids if kind == "event") - ephemeral >= events
                and sum(1 for kind, _ in ids if kind == "receipt") >= receipts)
    return done


def _count(n: int) -> Callable[[list[Sse]], bool]:
    return lambda messages: len(messages) >= n


def _after(before: list[Sse], complete: Callable[[list[Sse]], bool]) -> Callable[[list[Sse]], bool]:
    return lambda messages: complete(before + messages)


def _answered_thread(ui: Inspected) -> tuple[str, int, int]:
    """A new thread that has answered, with its committed events and receipts counted."""
    thread = f"resume-{uuid.uuid4().hex[:8]}"
    send(ui.deployment, thread, "hostile", "--new", "--model", "scripted")

    def answered() -> tuple[int, int] | None:
        found = _get(ui, f"/api/thread?id={thread}")
        row = found.json() if found.status_code == 200 else {}
        # create, user message, completion: three receipts once the thread answered.
        if row.get("receipts") == 3 and row["status"] == "idle":
            return row["events"], row["receipts"]
        return None

    events, receipts = wait_until(answered, timeout=WAIT_S, message=f"thread {thread} to answer")
    return thread, events, receipts


def test_a_stream_cut_anywhere_and_resumed_shows_each_record_once(ui: Inspected) -> None:
    thread, events, receipts = _answered_thread(ui)
    complete = _complete(events, receipts)
    whole = _read(ui, thread, complete)
    assert whole[0].event == "snapshot" and len(whole) >= 1 + receipts
    assert any(HOSTILE_TEXT in json.dumps(m.data) for m in whole)
    expected = _records(whole)
    assert len(expected) == len(set(expected)), expected
    for cut in range(1, len(whole)):
        first = _read(ui, thread, _count(cut))
        rest = _read(ui, thread, _after(first, complete), last_id=first[-1].id)
        joined = _records(first) + _records(rest)
        assert len(joined) == len(set(joined)), f"a record twice, cut after {cut} messages: {joined}"
        assert sorted(joined) == sorted(expected), f"cut after {cut} messages"


def test_a_resume_position_that_is_not_one_is_refused(ui: Inspected) -> None:
    response = _get(ui, "/api/thread/stream?id=x", **{"Last-Event-ID": '{"no colon": 1}'})
    assert response.status_code == 400


def test_operator_actions_need_the_pages_token_and_origin(ui: Inspected) -> None:
    thread, _, _ = _answered_thread(ui)
    url = ui.url + "api/control"
    body = {"thread_id": thread, "command": "stop", "reason": "<b>hostile</b>"}
    assert httpx.post(url, json=body, timeout=30).status_code == 403
    assert httpx.post(url, json=body, headers={"X-Torpor-Token": "guess"}, timeout=30).status_code == 403
    token = _token(ui)
    foreign = httpx.post(url, json=body, headers={"X-Torpor-Token": token, "Origin": "http://evil.example"},
                         timeout=30)
    assert foreign.status_code == 403, foreign.text
    form = httpx.post(url, data=body, headers={"X-Torpor-Token": token}, timeout=30)
    assert form.status_code == 415, form.text
    rebound = httpx.get(ui.url, headers={"Host": "evil.example"}, timeout=30)
    assert rebound.status_code == 400 and token not in rebound.text

    for bad in ({**body, "command": "delete"}, {**body, "command": "cancel_call"},
                {**body, "thread_id": "a b"}, {**body, "thread_id": "\ud800"}, {**body, "thread_id": 7}, [1]):
        refused = httpx.post(url, content=json.dumps(bad), timeout=30,
                             headers={"X-Torpor-Token": token, "Content-Type": "application/json"})
        assert refused.status_code == 400, (bad, refused.text)

    origin = ui.url.rstrip("/")
    done = httpx.post(url, json=body, headers={"X-Torpor-Token": token, "Origin": origin}, timeout=30)
    assert done.status_code == 200, done.text
    message_id = done.json()["message_id"]
    assert done.json()["source"] == "operator:inspector-test"

    def receipt(messages: list[Sse]) -> bool:
        return any(m.event == "record" and m.data["record"].get("input_id") == message_id
                   for m in messages)
    stream = _read(ui, thread, receipt)
    got = next(m.data["record"] for m in stream if m.event == "record"
               and m.data["record"].get("input_id") == message_id)
    assert got["disposition"] == "applied" and got["provenance"]
    wait_until(lambda: _get(ui, f"/api/thread?id={thread}").json()["status"] == "stopped", timeout=WAIT_S,
               message="the thread listed as stopped")
    listed = _get(ui, "/api/threads?status=stopped&q=" + thread).json()
    assert [r["thread_id"] for r in listed["rows"]] == [thread]
    assert listed["rows"][0]["reason"] == "<b>hostile</b>"


def test_the_page_forbids_inline_script_and_framing(ui: Inspected) -> None:
    page = _get(ui, "/")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "frame-ancestors 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in page.text  # the script is a file of its own
    assert _get(ui, "/api/threads?limit=100000").status_code == 400
    assert _get(ui, "/api/thread?id=" + uuid.uuid4().hex).status_code == 404
    # Time travel re-folds a partition: only the page may ask (another site cannot send the token).
    at = f"/api/thread/at?id={uuid.uuid4().hex}&offset=0"
    assert _get(ui, at).status_code == 403
    assert _get(ui, at, **{"X-Torpor-Token": "guess"}).status_code == 403
    token = _token(ui)
    assert _get(ui, at, **{"X-Torpor-Token": token, "Origin": "http://evil.example"}).status_code == 403
    assert _get(ui, "/api/thread/at?id=x&offset=-1", **{"X-Torpor-Token": token}).status_code == 400
    assert _get(ui, "/api/thread/at?id=x&offset=<b>", **{"X-Torpor-Token": token}).status_code == 400
    assert _get(ui, at, **{"X-Torpor-Token": token}).status_code == 404
    for bad in ("a b", "<script>", "x" * 300, "%00"):  # ids no input can carry: refused, nothing re-folded
        refused = _get(ui, f"/api/thread/at?id={bad}&offset=0", **{"X-Torpor-Token": token})
        assert refused.status_code == 400 and "not a thread id" in refused.json()["error"], refused.text


def test_a_ui_started_before_the_topics_exist_says_so_and_catches_up_once_they_do(
        kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> None:
    early = Deployment(kafka_bootstrap, tmp_path, prefix=f"test.ui.{uuid.uuid4().hex[:10]}.")
    early.start([TORPOR, "ui", "--port", "0"], "ui")
    try:
        found = wait_until(lambda: re.search(r"torpor ui: (http://\S+/)", early.log("ui")), timeout=60,
                           message="the ui's address")
        threads = found.group(1) + "api/threads"
        said = wait_until(lambda: httpx.get(threads, timeout=30).json()["feed_error"], timeout=WAIT_S,
                          message="the feed to say what is wrong")
        assert f"{early.prefix}events" in said
        ensure_topics(admin, settings_of(early), Deadline.after(60))
        wait_until(lambda: (state := httpx.get(threads, timeout=30).json())["caught_up"]
                   and state["feed_error"] is None, timeout=WAIT_S, message="the feed to catch up")
    finally:
        early.stop_all()
        for future in admin.delete_topics(list(TopicNames.for_prefix(early.prefix).all()),
                                          operation_timeout=30).values():
            future.result(timeout=60)
