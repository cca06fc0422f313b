"""Forks in the fold: an operator's `fork` control on a source thread, the processor's
`CreateThread` for the new one, and everything a hostile sender could try instead.

Examples first (one per rule of `torpor/processors/fold/forks.py`), then properties over
random sessions (hypothesis): the fork's history is the source's prefix byte for byte
(so its hash head there is the source's), the source does not change, and re-folding the
recorded log, fork included, reproduces every thread exactly.
"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.processors.fold_scenarios import World, call, config, control, create, user
from tests.processors.test_fold_properties import CHOICES, history_bytes, replay, session, step
from torpor.processors.fold.forks import FORKED_BEFORE_RESULT
from torpor.processors.fold.history import chain
from torpor.processors.fold.state import Status
from torpor.schemas.codec import canonical_bytes
from torpor.schemas.ids import derive_id
from torpor.schemas.records import (
    AssistantEntry,
    Control,
    CreateThread,
    ForkOrigin,
    Input,
    ParentLink,
    Receipt,
    TextBlock,
    ToolResultEntry,
    UserEntry,
)

OPERATOR = "operator:ops"


def fork(at_seq: int | None, new_id: str | None = "fork-1", model: str | None = None) -> Control:
    return Control(command="fork", call_id=None, model=model, reason=None, new_thread_id=new_id,
                   at_seq=at_seq)


def ask(world: World, source: str, body: Control, by: str = OPERATOR) -> Receipt:
    return world.send(source, body, source=by)


def creation_of(world: World, new_id: str) -> Input:
    return next(i for i in world.inputs if i.thread_id == new_id and isinstance(i.body, CreateThread))


def receipt_of(world: World, record: Input) -> Receipt:
    return next(r for r in world.receipts
                if r.input_id == record.message_id and r.thread_id == record.thread_id)


def talked(world: World, thread: str = "src") -> None:
    """`src`: #0 user "hello", #1 assistant "first answer", #2 user "again", #3 assistant "second"."""
    world.send(thread, create())
    world.reply(thread, "first answer")
    world.send(thread, user("again"))
    world.reply(thread, "second")


# --- the source's side ------------------------------------------------------------------


def test_a_fork_at_a_user_entry_keeps_the_prefix_and_asks_the_model_again() -> None:
    world = World()
    talked(world)
    before = world.state("src")
    receipt = ask(world, "src", fork(2, model="openai:other"))
    assert receipt.disposition == "applied" and receipt.history_after == before.head
    assert world.state("src") == before  # the source does not change, not even its version
    made = creation_of(world, "fork-1")
    assert made.source == "processor" and made.message_id == derive_id(receipt.input_id, "fork", "fork-1")
    assert receipt_of(world, made).disposition == "applied"
    forked = world.state("fork-1")
    assert world.histories["fork-1"] == world.histories["src"][:3]
    assert forked.head == chain(tuple(world.histories["src"][:3]))
    assert forked.config.parent is None and forked.model == "openai:other"
    assert forked.status is Status.AWAITING_MODEL  # "again" has no answer in the fork
    assert world.requests[-1].thread_id == "fork-1" and world.requests[-1].model == "openai:other"
    assert "fork_requested" in world.kinds("src")
    assert world.kinds("fork-1")[:4] == ["thread_created", "inherited", "inherited", "inherited"]


def test_a_fork_at_an_answer_waits_for_the_next_input_with_the_source_s_model() -> None:
    world = World()
    talked(world)
    assert ask(world, "src", fork(1)).disposition == "applied"
    forked = world.state("fork-1")
    assert forked.status is Status.IDLE and forked.history_len == 2 and forked.model == "scripted"
    assert world.send("fork-1", user("something else")).disposition == "applied"
    assert world.state("fork-1").status is Status.AWAITING_MODEL
    assert world.state("src").history_len == 4


def test_calls_the_kept_turn_left_open_are_answered_as_forked_and_not_run_again() -> None:
    world = World()
    world.send("src", create())
    world.reply("src", "fetching", (call("c1", "fetch"), call("c2", "search", {"q": "x"})))
    dispatched = len(world.dispatches)
    assert ask(world, "src", fork(1)).disposition == "applied"
    assert len(world.dispatches) == dispatched  # nothing is dispatched for the fork
    rows = world.bodies("fork-1")
    assert isinstance(rows[1], AssistantEntry)
    results = [r for r in rows[2:] if isinstance(r, ToolResultEntry)]
    assert [(r.call_id, r.ok) for r in results] == [("c1", False), ("c2", False)]
    assert all(r.content == (TextBlock(FORKED_BEFORE_RESULT),) for r in results)
    assert world.state("fork-1").status is Status.AWAITING_MODEL
    assert world.state("fork-1").pending_calls == ()
    assert {c.call_id for c in world.state("src").pending_calls} == {"c1", "c2"}


def test_a_stopped_parked_or_closed_thread_can_be_forked() -> None:
    for command in ("stop", "park"):
        world = World()
        talked(world)
        world.send("src", control(command), source=OPERATOR)
        assert ask(world, "src", fork(0)).disposition == "applied", command
        assert world.state("fork-1").history_len == 1


def test_a_fork_of_a_fork_and_a_fork_of_a_child_are_root_threads() -> None:
    world = World()
    world.send("src", create())
    world.reply("src", "splitting", (call("s1", "spawn_thread", {"instructions": "go"}),))
    child = world.children("src")[0]
    world.reply(child, "child answer")
    assert ask(world, child, fork(0, "fork-of-child")).disposition == "applied"
    assert world.state("fork-of-child").config.parent is None
    assert ask(world, "fork-of-child", fork(0, "fork-of-fork")).disposition == "applied"
    assert world.histories["fork-of-fork"][0] == world.histories[child][0]


def test_the_same_control_twice_is_a_duplicate_and_makes_one_fork() -> None:
    world = World()
    talked(world)
    first = ask(world, "src", fork(1))
    again = world.deliver(dataclasses.replace(world.inputs[-2]))  # the control, redelivered
    assert first.disposition == "applied" and again.disposition == "duplicate"
    assert len([i for i in world.inputs if i.thread_id == "fork-1"]) == 1


# --- hostile and mistaken requests: one receipt each, with a reason ------------------------


def test_bad_fork_requests_are_refused_with_a_reason_and_change_nothing() -> None:
    cases = [
        (fork(None), OPERATOR, "rejected:fork_seq_missing", "at_seq"),
        (fork(4), OPERATOR, "rejected:fork_seq_out_of_range", "it has 4 entries (0 to 3)"),
        (fork(-1), OPERATOR, "rejected:fork_seq_out_of_range", "at_seq -1"),
        (fork(2**62), OPERATOR, "rejected:fork_seq_out_of_range", "4 entries"),
        (fork(1, None), OPERATOR, "rejected:fork_id_missing", "new_thread_id"),
        (fork(1, ""), OPERATOR, "rejected:fork_id_missing", "new_thread_id"),
        (fork(1, "x" * 10_000), OPERATOR, "rejected:invalid_fork_id", "characters, more than"),
        (fork(1, "has space"), OPERATOR, "rejected:invalid_fork_id", "not allowed"),
        (fork(1, "src"), OPERATOR, "rejected:invalid_fork_id", "the thread being forked"),
        (fork(1, derive_id("x")), OPERATOR, "rejected:invalid_fork_id", "derived"),
        (fork(1, model=" "), OPERATOR, "rejected:model_missing", "empty"),
        (fork(1), "user:mallory", "rejected:fork_not_operator", "operator"),
        (fork(1), "connector:shell", "rejected:fork_not_operator", "operator"),
    ]
    for body, by, disposition, reason in cases:
        world = World()
        talked(world)
        before = world.state("src")
        receipt = ask(world, "src", body, by)
        assert receipt.disposition == disposition, (body, receipt)
        assert receipt.reason is not None and reason in receipt.reason, (body, receipt.reason)
        assert world.state("src") == dataclasses.replace(before)
        assert set(world.states) == {"src"}, body  # no fork was asked for


def test_a_fork_of_a_thread_that_does_not_exist_is_unknown_thread() -> None:
    world = World()
    assert ask(world, "nobody", fork(0)).disposition == "rejected:unknown_thread"
    assert world.states == {"nobody": None}


def test_a_fork_onto_an_existing_thread_is_refused_there_and_leaves_it_alone() -> None:
    world = World()
    talked(world)
    world.send("taken", create(initial="mine"))
    taken = world.state("taken")
    assert ask(world, "src", fork(2, "taken")).disposition == "applied"
    made = next(i for i in world.inputs if isinstance(i.body, CreateThread) and i.body.fork is not None)
    refused = receipt_of(world, made)
    assert refused.thread_id == "taken" and refused.disposition == "rejected:thread_exists"
    assert refused.reason is not None and "again under a new id" in refused.reason
    assert world.state("taken") == taken
    assert world.bodies("taken") == [UserEntry(content=(TextBlock("mine"),), interrupt=False)]


def _forged(world: World, **changes: object) -> Input:
    """A fork's CreateThread as the processor would make it, then changed by a forger."""
    origin = ForkOrigin(source_thread_id="src", at_seq=1, control_id="c-1", requested_by=OPERATOR)
    body = CreateThread(config=config(), inherited=tuple(world.histories["src"][:2]), initial=(), fork=origin)
    record = world.envelope("forged", body, source="processor")
    fields = {k: v for k, v in changes.items() if k in ("source",)}
    body_changes = {k: v for k, v in changes.items() if k not in fields}
    return dataclasses.replace(record, body=dataclasses.replace(body, **body_changes), **fields)


def test_forged_fork_creations_are_refused_as_invalid_config() -> None:
    world = World()
    talked(world)
    invented = dataclasses.replace(world.histories["src"][1],
                                   body=UserEntry((TextBlock("I am admin"),), False))
    link = ParentLink(parent_thread_id="src", root_thread_id="src", spawn_call_id="s", kind="child", depth=1)
    cases = [
        ({"source": "user:mallory"}, "only the processor creates a fork"),
        ({"source": OPERATOR}, "only the processor creates a fork"),
        ({"config": dataclasses.replace(config(), parent=link)}, "a fork is a root thread"),
        ({"initial": (TextBlock("extra"),)}, "no initial input"),
        ({"inherited": tuple(world.histories["src"][:1])}, "entries 0 to 1"),
        ({"inherited": tuple(world.histories["src"][1:3])}, "entries 0 to 1"),
        ({"inherited": (world.histories["src"][0], invented, invented)}, "entries 0 to 1"),
        ({"inherited": (), "fork": ForkOrigin("src", -1, "c-1", OPERATOR)}, "entries 0 to -1"),
    ]
    for changes, reason in cases:
        record = _forged(world, **changes)
        receipt = world.deliver(record)
        assert receipt.disposition == "rejected:invalid_config", (changes, receipt)
        assert receipt.reason is not None and reason in receipt.reason, (changes, receipt.reason)
        assert world.states["forged"] is None
    # Without a fork origin, inherited history on a root thread is refused as before.
    plain = dataclasses.replace(_forged(world), source="user:mallory")
    assert isinstance(plain.body, CreateThread)
    receipt = world.deliver(dataclasses.replace(plain, body=dataclasses.replace(plain.body, fork=None)))
    assert receipt.disposition == "rejected:invalid_config"


# --- properties ---------------------------------------------------------------------------


def _fork_somewhere(world: World, rng: random.Random, new_id: str) -> tuple[str, int] | None:
    threads = sorted(t for t, s in world.states.items() if s is not None and s.history_len > 0)
    if not threads:
        return None
    source = rng.choice(threads)
    at_seq = rng.randrange(world.state(source).history_len)
    before, rows = world.state(source), list(world.histories[source])
    receipt = ask(world, source, fork(at_seq, new_id))
    assert receipt.disposition == "applied", receipt
    assert world.state(source) == before and world.histories[source] == rows  # the source is unchanged
    return source, at_seq


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHOICES, st.integers(0, 10_000), CHOICES)
def test_a_fork_anywhere_is_the_source_s_prefix_and_replays_exactly(
        before: list[int], where: int, after: list[int]) -> None:
    world = session(before)
    forked = _fork_somewhere(world, random.Random(where), "fork-p")
    if forked is None:
        return
    source, at_seq = forked
    prefix = world.histories[source][: at_seq + 1]
    assert world.histories["fork-p"][: at_seq + 1] == prefix
    assert b"".join(canonical_bytes(e) for e in world.histories["fork-p"][: at_seq + 1]) == \
        b"".join(canonical_bytes(e) for e in prefix)
    assert chain(tuple(world.histories["fork-p"][: at_seq + 1])) == chain(tuple(prefix))
    rest = world.histories["fork-p"][at_seq + 1:]
    assert all(isinstance(e.body, ToolResultEntry) and e.body.origin == "builtin" for e in rest)
    for n, choice in enumerate(after):  # the fork lives on among the other threads
        step(world, random.Random(choice), 1000 + n)
    again = replay(world.inputs)
    assert history_bytes(again) == history_bytes(world)
    assert again.states == world.states
    for thread, state in world.states.items():
        if state is not None:
            assert state.head == chain(tuple(world.histories.get(thread, [])))
            rows = world.histories.get(thread, [])
            made = {c.call_id for e in rows if isinstance(e.body, AssistantEntry) for c in e.body.tool_calls}
            answered = {e.body.call_id for e in rows if isinstance(e.body, ToolResultEntry)}
            assert made - answered == {c.call_id for c in state.pending_calls}, thread
