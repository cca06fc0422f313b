"""The threads list as a fold of events and receipts: statuses, approvals, children, search, pages."""

from __future__ import annotations

import json

import pytest

from torpor.inspector.index import MAX_LIMIT, ThreadIndex
from torpor.schemas.records import Capability, HistoryEntry, Receipt, TextBlock, ThreadEvent, ToolResultEntry


def _event(thread: str, kind: str, at: int, data: object = None, text: str | None = None,
           entry: HistoryEntry | None = None, ephemeral: bool = False) -> ThreadEvent:
    return ThreadEvent(event_id=f"{thread}-{kind}-{at}", thread_id=thread, created_at=at, kind=kind,
                       ephemeral=ephemeral, seq=None, entry=entry, text=text,
                       data=json.dumps(data) if data is not None else None)


def _receipt(thread: str, at: int, tenant: str = "acme") -> Receipt:
    return Receipt(receipt_id=f"r-{thread}-{at}", thread_id=thread, input_id=f"i-{at}", input_partition=0,
                   input_offset=at, created_at=at, disposition="applied", reason=None, history_before="00",
                   history_after="11", thread_version=1, tool_request_ids=(),
                   authority_snapshot=Capability(tenant, (), (), None), turn_commit=False,
                   provenance="verified", retry_count=0, runtime_build="test")


def _result(call_id: str) -> HistoryEntry:
    return HistoryEntry(seq=2, created_at=5, input_id="i",
                        body=ToolResultEntry(call_id, "deploy", True, (TextBlock("ok"),), "tool"))


def test_a_thread_s_status_calls_and_approvals_follow_its_events() -> None:
    index = ThreadIndex()
    for record in (
        _event("t1", "thread_created", 1, {"parent": None}),
        _receipt("t1", 1),
        _event("t1", "completion_requested", 2, {"model": "scripted", "request_id": "q"}),
        _event("t1", "delta", 3, text="he", ephemeral=True),
        _event("t1", "turn_committed", 4),
        _event("t1", "tool_dispatched", 4, {"call_id": "c1", "tool": "deploy"}),
        _event("t1", "approval_requested", 5,
               {"approval_id": "a1", "call_id": "c1", "choices": ["yes", "no"]}, text="Deploy?"),
    ):
        index.observe(record)
    row = index.summary("t1")
    assert row is not None
    assert (row.status, row.model, row.tenant) == ("awaiting_tools", "scripted", "acme")
    assert row.pending_calls == ("c1",)
    assert [(a.approval_id, a.prompt, a.choices) for a in row.approvals] == [("a1", "Deploy?", ("yes", "no"))]
    assert row.events == 5 and row.receipts == 1 and row.last_activity == 5
    index.observe(_event("t1", "approval_decided", 6, {"approval_id": "a1", "choice": "yes"}))
    index.observe(_event("t1", "tool_result", 7, entry=_result("c1")))
    row = index.summary("t1")
    assert row is not None and row.approvals == () and row.pending_calls == ()


def test_stopped_and_parked_stick_until_resumed_or_unparked() -> None:
    index = ThreadIndex()
    index.observe(_event("t1", "thread_created", 1, {}))
    index.observe(_event("t1", "parked", 2, text="model failed"))
    index.observe(_event("t1", "completion_requested", 3, {"model": "m"}))
    row = index.summary("t1")
    assert row is not None and (row.status, row.reason) == ("parked", "model failed")
    index.observe(_event("t1", "unparked", 4))
    row = index.summary("t1")
    assert row is not None and (row.status, row.reason) == ("idle", None)
    index.observe(_event("t1", "stopped", 5, text="operator"))
    row = index.summary("t1")
    assert row is not None and (row.status, row.reason) == ("stopped", "operator")


def test_children_are_listed_under_their_parent_whichever_side_is_seen_first() -> None:
    index = ThreadIndex()
    index.observe(_event("kid-a", "thread_created", 1, {"parent": "root"}))
    index.observe(_event("root", "child_spawned", 2, {"child_thread_id": "kid-a"}))
    index.observe(_event("root", "child_spawned", 3, {"child_thread_id": "kid-b"}))
    root = index.summary("root")
    assert root is not None and root.children == ("kid-a", "kid-b")
    kid = index.summary("kid-a")
    assert kid is not None and kid.parent == "root"


def test_search_and_pages_are_answered_on_the_server_newest_first() -> None:
    index = ThreadIndex()
    for n in range(250):
        index.observe(_event(f"agent-{n:03}", "thread_created", n, {}))
        if n % 2:
            index.observe(_event(f"agent-{n:03}", "stopped", n))
    page = index.query(offset=0, limit=10)
    assert page.total == 250 and [r.thread_id for r in page.rows][:2] == ["agent-249", "agent-248"]
    stopped = index.query(status="stopped", offset=100, limit=50)
    assert stopped.total == 125 and len(stopped.rows) == 25
    assert all(r.status == "stopped" for r in stopped.rows)
    found = [r.thread_id for r in index.query("AGENT-00", limit=50).rows]
    assert found == [f"agent-00{n}" for n in range(9, -1, -1)]
    with pytest.raises(ValueError):
        index.query(limit=MAX_LIMIT + 1)
    with pytest.raises(ValueError):
        index.query(offset=-1)


def test_data_that_is_not_an_object_changes_nothing_but_the_count() -> None:
    index = ThreadIndex()
    index.observe(_event("t1", "approval_requested", 1, [1, 2]))
    index.observe(ThreadEvent("e", "t1", 2, "child_spawned", False, None, None, None, "{not json"))
    row = index.summary("t1")
    assert row is not None and row.approvals == () and row.children == () and row.events == 2
