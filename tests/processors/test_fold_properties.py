"""Properties of the fold over random thread lifecycles (hypothesis).

A random "session" drives a `World` (see `fold_scenarios.py`): users write, the model
answers with random calls (tools, subscriptions, sleeps, spawns, reports, closes,
unknown tools), connectors answer, events and timers arrive, operators stop, resume,
park, unpark, compact and fork, and stale or late inputs turn up. The recorded input log is
then re-folded to check the invariants of DESIGN section 2.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.processors.fold_scenarios import (
    World,
    call,
    completion,
    config,
    control,
    create,
    event,
    result,
    user,
)
from torpor.processors.fold.history import chain
from torpor.processors.fold.state import CallKind, Status
from torpor.schemas.codec import canonical_bytes
from torpor.schemas.records import AssistantEntry, Control, Input, TimerFired, ToolCall, ToolResultEntry

CHOICES = st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=40)


def _calls(rng: random.Random, thread: str, n: int, is_child: bool) -> tuple[ToolCall, ...]:
    options = ["fetch", "watch", "sleep", "spawn", "nope", "search_bad", "wait"]
    if is_child:
        options += ["report", "close", "close"]
    picked = []
    for i in range(rng.randint(0, 2)):
        kind = rng.choice(options)
        cid = f"{thread}-c{n}-{i}"
        picked.append(
            {
                "fetch": call(cid, "fetch", {}),
                "watch": call(cid, "watch", {}),
                "sleep": call(cid, "sleep", {"seconds": 5}),
                "spawn": call(cid, "spawn_thread", {"instructions": f"job {n}"}),
                "nope": call(cid, "nope", {}),
                "search_bad": call(cid, "search", {"q": 1}),
                "wait": call(cid, "sleep_until_event_or_input", {}),
                "report": call(cid, "report_to_parent", {"report": f"r{n}"}),
                "close": call(cid, "close_thread", {"report": f"bye {n}"}),
            }[kind]
        )
    return tuple(picked)


def step(world: World, rng: random.Random, n: int) -> None:
    """One random, plausible thing happening to the threads of `world`."""
    threads = sorted(t for t, s in world.states.items() if s is not None)
    thread = rng.choice(threads)
    state = world.state(thread)
    action = rng.randrange(10)
    if action <= 2 and state.pending_request is not None:
        calls = _calls(rng, thread, n, state.config.parent is not None)
        world.send(
            thread, completion(state.pending_request, f"turn {n}", calls, total_tokens=rng.randint(1, 99_000))
        )
    elif action <= 4 and state.pending_calls:
        pending = rng.choice(state.pending_calls)
        if pending.kind is CallKind.TOOL:
            world.send(
                thread, result(pending.call_id, pending.request_id, subscription=pending.tool == "watch")
            )
        elif pending.kind is CallKind.TIMER:
            world.send(thread, TimerFired(call_id=pending.call_id, request_id=pending.request_id, due_at=0))
        else:
            world.send(thread, user(f"poke {n}"))
    elif action == 5 and state.subscriptions:
        sub = rng.choice(state.subscriptions)
        seq = sub.last_sequence + rng.choice((0, 1, 1, 2))
        world.send(thread, event(sub.call_id, sub.request_id, seq, f"e{n}", associative=rng.random() < 0.5))
    elif action == 6:
        command = rng.choice(("stop", "resume", "park", "unpark", "compact", "cancel_call", "set_model",
                              "fork"))
        target = rng.choice(state.pending_calls).call_id if state.pending_calls else "none"
        if command == "fork":  # at any entry, or one past the last (refused), onto a new id or a taken one
            at_seq = rng.randrange(state.history_len + 1)
            new_id = rng.choice((f"{thread}-f{n}", f"{thread}-f{n}", "root"))
            world.send(thread, Control(command="fork", call_id=None, model=rng.choice((None, "other")),
                                       reason=None, new_thread_id=new_id, at_seq=at_seq),
                       source="operator:ops")
        else:
            world.send(thread, control(command, call_id=target, model="other", reason=f"op {n}"))
    elif action == 7:
        world.send(thread, completion(f"old-{n}", "late"))  # a completion nobody asked for
    elif action == 8:
        world.send(thread, result(f"{thread}-c{max(n - 1, 0)}-0", "wrong-request"))
    else:
        world.send(thread, user(f"hello {n}"))


def session(choices: list[int]) -> World:
    world = World()
    world.send("root", create(config(context_window=100_000)))
    for n, choice in enumerate(choices):
        step(world, random.Random(choice), n)
    return world


def replay(log: list[Input]) -> World:
    world = World(auto_deliver=False)
    for record in log:
        world.deliver(record)
    return world


def history_bytes(world: World) -> dict[str, bytes]:
    return {t: b"".join(canonical_bytes(e) for e in rows) for t, rows in world.histories.items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHOICES)
def test_every_input_gets_exactly_one_receipt(choices: list[int]) -> None:
    world = session(choices)
    assert len(world.receipts) == len(world.inputs) == len(world.transitions)
    assert [r.input_id for r in world.receipts] == [i.message_id for i in world.inputs]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHOICES)
def test_folding_a_recorded_log_twice_gives_identical_histories_and_effects(choices: list[int]) -> None:
    world = session(choices)
    first, second = replay(world.inputs), replay(world.inputs)
    assert history_bytes(first) == history_bytes(second) == history_bytes(world)
    assert [t.effects for t in first.transitions] == [t.effects for t in second.transitions]
    assert first.states == second.states == world.states
    for thread, state in world.states.items():
        if state is not None:
            assert state.head == chain(tuple(world.histories.get(thread, [])))
            assert state.history_len == len(world.histories.get(thread, []))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CHOICES, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)), max_size=12))
def test_duplicates_anywhere_change_nothing_but_their_receipts(
    choices: list[int], copies: list[tuple[int, int]]
) -> None:
    log = session(choices).inputs
    noisy = list(log)
    for which, delay in copies:
        original = which % len(log)
        position = noisy.index(log[original]) + 1 + delay % (len(noisy) - noisy.index(log[original]))
        noisy.insert(position, log[original])
    clean, dirty = replay(log), replay(noisy)
    assert dirty.states == clean.states
    assert history_bytes(dirty) == history_bytes(clean)

    # Every copy is a duplicate (provenance is always verified here).
    def accepted(world: World) -> list[str]:
        return [
            r.input_id
            for r in world.receipts
            if r.disposition != "duplicate" and "rejected:" not in r.disposition
        ]

    assert accepted(dirty) == accepted(clean)


class ThreadLifecycle(RuleBasedStateMachine):
    """Whole lifecycles, with the invariants checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.world = World()
        self.world.send("root", create(config(max_invalid_calls=2)))
        self.n = 0

    @rule(choice=st.integers(0, 10_000))
    def something_happens(self, choice: int) -> None:
        self.n += 1
        step(self.world, random.Random(choice), self.n)

    @rule()
    def redeliver_the_last_input(self) -> None:
        before, first = dict(self.world.states), self.world.receipts[-1].disposition
        self.world.deliver(self.world.inputs[-1])
        again = self.world.receipts[-1].disposition
        assert again == "duplicate", first
        assert self.world.states == before

    @invariant()
    def heads_match_histories_and_statuses_match_pending_work(self) -> None:
        for thread, state in self.world.states.items():
            if state is None:
                continue
            assert state.head == chain(tuple(self.world.histories.get(thread, [])))
            if state.status is Status.AWAITING_MODEL:
                assert state.pending_request is not None and not state.pending_calls
            if state.status is Status.AWAITING_TOOLS:
                assert state.pending_calls and state.pending_request is None
            if state.status is Status.IDLE:
                assert not state.pending_calls and state.pending_request is None and not state.deferred

    @invariant()
    def the_calls_without_a_result_are_exactly_the_pending_ones(self) -> None:
        for thread, state in self.world.states.items():
            if state is None:
                continue
            rows = self.world.histories.get(thread, [])
            made = {c.call_id for e in rows if isinstance(e.body, AssistantEntry) for c in e.body.tool_calls}
            answered = {e.body.call_id for e in rows if isinstance(e.body, ToolResultEntry)}
            assert made - answered == {c.call_id for c in state.pending_calls}

    @invariant()
    def every_answered_call_has_exactly_one_result(self) -> None:
        for rows in self.world.histories.values():
            answered = [e.body.call_id for e in rows if type(e.body).__name__ == "ToolResultEntry"]
            assert len(answered) == len(set(answered))


ThreadLifecycle.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_thread_lifecycle = ThreadLifecycle.TestCase
