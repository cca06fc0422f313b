"""Golden histories for named scenarios, reviewed as diffs.

Each scenario is folded with the in-memory driver and rendered as text: every thread's
history (one line per entry), every receipt's disposition, and the final hash heads.
Run with `TORPOR_UPDATE_GOLDEN=1` to rewrite `tests/processors/golden/*.txt`, then
review the diff like code.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.processors.fold_scenarios import World, call, config, create, event, result, user
from torpor.schemas.ids import PREFIX as DERIVED_PREFIX
from torpor.schemas.records import (
    AssistantEntry,
    ContentBlock,
    Control,
    EventEntry,
    HistoryBody,
    SummaryEntry,
    TextBlock,
    ToolResultEntry,
    UserEntry,
)

GOLDEN = Path(__file__).parent / "golden"


def _text(blocks: tuple[ContentBlock, ...] | tuple[object, ...]) -> str:
    return " ".join(b.text for b in blocks if isinstance(b, TextBlock)).replace("\n", "\\n")


def _line(body: HistoryBody) -> str:
    match body:
        case UserEntry():
            return f"user{' (interrupt)' if body.interrupt else ''}: {_text(body.content)}"
        case AssistantEntry():
            calls = ", ".join(f"{c.name}#{c.call_id}({c.arguments})" for c in body.tool_calls)
            return f"assistant: {_text(body.content)}" + (f" | calls: {calls}" if calls else "")
        case ToolResultEntry():
            origin = body.origin if body.ok else f"{body.origin}, error"
            return f"result {body.name}#{body.call_id} [{origin}]: {_text(body.content)}"
        case EventEntry():
            bound = f"{body.original_tool_name}#{body.original_tool_call_id}"
            return f"event {body.kind} via {bound}: {_text(body.content)}"
        case SummaryEntry():
            return f"summary up_to={body.up_to_seq}: {body.text}"


def render(world: World) -> str:
    lines: list[str] = []
    # Child ids are derived hashes; name them by order of creation so diffs stay readable
    # (root and forks keep the ids they were given).
    names = {thread: f"child{i}" if thread.startswith(DERIVED_PREFIX) else thread
             for i, thread in enumerate(world.histories)}
    for thread, rows in world.histories.items():
        state = world.states.get(thread)
        status = state.status.value if state else "deleted"
        lines.append(f"== thread {names[thread]} ({status}, head {state.head[:16] if state else '-'})")
        for entry in rows:
            rendered = _line(entry.body)
            for original, short in names.items():
                if original != short:
                    rendered = rendered.replace(original, short)
            lines.append(f"{entry.seq:3d} {rendered}")
    lines.append("== receipts")
    for receipt in world.receipts:
        name = names.get(receipt.thread_id, receipt.thread_id)
        lines.append(f"{name} {receipt.disposition} v{receipt.thread_version} {receipt.history_after[:12]}")
    return "\n".join(lines) + "\n"


def interrupted_tool_call() -> World:
    world = World()
    world.send("root", create())
    world.reply("root", "let me fetch", (call("c1", "fetch", {"url": "x"}),))
    request = world.dispatch_for("root", "c1").request_id
    world.send("root", user("never mind, just say hi"))
    world.send("root", result("c1", request, "too late"))
    world.reply("root", "hi")
    return world


def child_lifecycle() -> World:
    world = World()
    world.send("root", create())
    world.reply("root", "delegating", (call("s1", "spawn_thread", {"instructions": "count to 3"}),))
    world.reply("root", "waiting for the child")
    child = world.children("root")[0]
    world.reply(child, "1 2", (call("k1", "report_to_parent", {"report": "got to 2"}),))
    world.reply("root", "noted")
    world.reply(child, "3", (call("k2", "close_thread", {"report": "counted to 3"}),))
    world.reply("root", "the child is done")
    return world


def deferred_events_and_compaction() -> World:
    world = World()
    world.send("root", create(config(context_window=1000)))
    world.reply("root", "watching", (call("w1", "watch", {}),))
    sub = world.dispatch_for("root", "w1").request_id
    world.send("root", result("w1", sub, "subscribed", subscription=True))
    world.reply("root", "fetching too", (call("c1", "fetch", {}),))
    world.send("root", event("w1", sub, 1, "inline tick", associative=True))
    world.send("root", event("w1", sub, 1, "inline tick", associative=True))  # a re-sent copy
    world.send("root", result("c1", world.dispatch_for("root", "c1").request_id, "fetched"))
    world.reply("root", "that was a lot", total_tokens=900)
    compaction = world.state("root").compaction
    assert compaction is not None
    world.reply(
        compaction.child_thread_id, "summary", (call("z", "close_thread", {"report": "watching w1"}),)
    )
    return world


def forks_of_a_conversation() -> World:
    """Fork at a turn whose call is open (answered as forked), and at a later user entry with
    another model; each fork then goes its own way, the source unchanged."""
    world = World()
    world.send("root", create())
    world.reply("root", "let me fetch", (call("c1", "fetch", {"url": "x"}),))
    world.send("root", result("c1", world.dispatch_for("root", "c1").request_id, "fetched x"))
    world.reply("root", "x says hello")
    world.send("root", user("and y?"))
    world.reply("root", "y is quiet")
    for at_seq, new_id, model in ((1, "fork-at-call", None), (4, "fork-at-question", "other")):
        world.send("root", Control(command="fork", call_id=None, model=model, reason=None,
                                   new_thread_id=new_id, at_seq=at_seq), source="operator:ops")
    world.reply("fork-at-call", "I will not fetch after all")
    world.reply("fork-at-question", "y is loud")
    world.send("root", Control(command="fork", call_id=None, model=None, reason=None,
                               new_thread_id="fork-at-call", at_seq=0), source="operator:ops")
    return world


SCENARIOS: dict[str, Callable[[], World]] = {
    "forks_of_a_conversation": forks_of_a_conversation,
    "interrupted_tool_call": interrupted_tool_call,
    "child_lifecycle": child_lifecycle,
    "deferred_events_and_compaction": deferred_events_and_compaction,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_history(name: str) -> None:
    rendered = render(SCENARIOS[name]())
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("TORPOR_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(rendered)
    assert path.exists(), f"no golden file {path}; run with TORPOR_UPDATE_GOLDEN=1"
    assert rendered == path.read_text()
