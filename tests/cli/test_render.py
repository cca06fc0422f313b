"""The tail renderer without a broker: stable lines, the child tree, approvals, state round trip."""

from __future__ import annotations

import json

from torpor.cli.render import MAX_NAMES, Renderer
from torpor.schemas.records import HistoryEntry, Receipt, TextBlock, ThreadEvent, UserEntry
from torpor.streams.observer import Observed, Undecodable

ROOT = "root-thread"
CHILD = "tp_abcdef0123456789abcdef0123456789"
GRANDCHILD = "tp_1234560123456789abcdef0123456789"


def event(thread: str, kind: str, data: object = None, *, entry: HistoryEntry | None = None,
          text: str | None = None, ephemeral: bool = False, at: int = 1_700_000_000_123) -> Observed:
    record = ThreadEvent(event_id=f"e-{thread}-{kind}", thread_id=thread, created_at=at, kind=kind,
                         ephemeral=ephemeral, seq=entry.seq if entry else None, entry=entry, text=text,
                         data=None if data is None else json.dumps(data))
    return Observed("events", 0, 0, record)


def receipt(thread: str) -> Observed:
    record = Receipt(receipt_id="r", thread_id=thread, input_id="tp_0011223344556677", input_partition=1,
                     input_offset=7, created_at=1_700_000_000_123, disposition="rejected:bad", reason="why",
                     history_before="", history_after="", thread_version=3, tool_request_ids=(),
                     authority_snapshot=None, turn_commit=False, provenance="unsigned", retry_count=0,
                     runtime_build="t")
    return Observed("receipts", 0, 0, record)


def test_a_thread_and_its_descendants_render_as_a_tree_and_others_are_left_out() -> None:
    renderer = Renderer(root=ROOT)
    said = UserEntry((TextBlock("hello  there"),), False)
    user = HistoryEntry(seq=0, created_at=1, input_id="i", body=said)
    lines = [renderer.render(item) for item in (
        event(ROOT, "input_accepted", entry=user),
        event("someone-else", "thread_created", {"parent": None}),
        event(ROOT, "child_spawned", {"child_thread_id": CHILD, "spawn_call_id": "c"}),
        # The grandchild's creation may be read before any spawn event naming it.
        event(GRANDCHILD, "thread_created", {"parent": CHILD, "implicit": False}),
        event(GRANDCHILD, "delta", text="partial ", ephemeral=True),
        receipt(CHILD),
    )]
    assert lines[0] == "22:13:20.123  root-thread                  user             #0 hello there"
    assert lines[1] is None
    assert lines[2] is not None and "child_thread_id=" in lines[2]
    grandchild = f"22:13:20.123      {ROOT}/child:abcdef/child:123456 "  # indented two levels
    assert lines[3] is not None and lines[3].startswith(grandchild)
    assert lines[4] is not None and lines[4].endswith("model…           partial")
    assert lines[5] is not None and "  root-thread/child:abcdef" in lines[5]
    assert lines[5].endswith("receipt          rejected:bad (why) input=tp_00112233445 @1:7 v3 unsigned")

    again = Renderer.from_state(json.loads(json.dumps(renderer.state())), deltas=False)
    assert again.names == renderer.names
    assert again.render(event(GRANDCHILD, "delta", text="x", ephemeral=True)) is None


def test_an_approval_line_carries_the_whole_command_and_bad_records_are_shown() -> None:
    renderer = Renderer()
    line = renderer.render(event(ROOT, "approval_requested",
                                 {"approval_id": "approval-" + "x" * 60, "choices": ["approve", "reject"]},
                                 text="Deploy production?"))
    assert line is not None
    assert line.endswith(f"Deploy production? -> torpor approve approval-{'x' * 60} {{approve|reject}} "
                         f"--thread {ROOT}")
    bad = renderer.render(Undecodable("events", 2, 41, "not Avro"))
    assert bad is not None and bad.endswith("undecodable      events[2]@41: not Avro")


def test_a_tail_of_every_thread_keeps_only_the_newest_names() -> None:
    renderer = Renderer()
    for i in range(MAX_NAMES + 5):
        renderer.render(event(f"parent-{i}", "child_spawned", {"child_thread_id": f"tp_{i:032x}"}))
    assert len(renderer.names) == MAX_NAMES
    assert f"tp_{0:032x}" not in renderer.names and f"tp_{MAX_NAMES + 4:032x}" in renderer.names


def test_a_hostile_thread_id_or_text_cannot_forge_a_line_or_drive_the_terminal() -> None:
    forged = "t\n22:13:20.123  root-thread  receipt  applied\x1b[2J"
    renderer = Renderer()
    said = UserEntry((TextBlock("fine\r\n22:13:20.123  root-thread  approved\x1b]0;pwned\x07"),), False)
    lines = [renderer.render(item) for item in (
        receipt(forged),
        event(forged, "input_accepted", entry=HistoryEntry(seq=0, created_at=1, input_id="i", body=said)),
    )]
    for line in lines:
        assert line is not None and line.isprintable(), line
    assert lines[0] is not None and "t\\n22:13:20.123" in lines[0] and "\\x1b[2J" in lines[0]
