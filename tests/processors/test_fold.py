"""The fold, one scenario per table row and per tricky interleaving (no broker, no shell)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.processors.fold_scenarios import (
    FETCH,
    SEARCH,
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
from torpor.processors.fold import builtins as b
from torpor.processors.fold.calls import MAX_SLEEP_SECONDS
from torpor.processors.fold.effects import EmitEvent, EmitReceipt
from torpor.processors.fold.facts import Facts
from torpor.processors.fold.history import chain
from torpor.processors.fold.state import GENESIS_HEAD, Status
from torpor.processors.fold.transitions import BODY_TYPES, TRANSITIONS, fold, park_on_failure
from torpor.schemas.codec import decode_value, encode_value
from torpor.schemas.records import (
    INJECTED_TOOL,
    ApprovalDecision,
    ApprovalRequest,
    AssistantEntry,
    ChildReport,
    CompletionError,
    Dispatch,
    EventEntry,
    Input,
    ParentLink,
    ParentMessage,
    SummaryEntry,
    TextBlock,
    TimerFired,
    ToolResultEntry,
    UserEntry,
)


def started(**overrides: object) -> World:
    world = World()
    world.send("t", create(config(**overrides)))  # type: ignore[arg-type]
    return world


def with_call(world: World, *calls: tuple[str, str, object]) -> None:
    world.reply("t", "working", tuple(call(c, name, args) for c, name, args in calls))


def results(world: World, thread: str = "t") -> list[ToolResultEntry]:
    return [e for e in world.bodies(thread) if isinstance(e, ToolResultEntry)]


# --- the table -----------------------------------------------------------------------


def test_transitions_table_covers_every_status_and_body_type() -> None:
    missing = [(s, t) for s in Status for t in BODY_TYPES if (s, t) not in TRANSITIONS]
    assert missing == []
    assert len(TRANSITIONS) == len(Status) * len(BODY_TYPES)


def test_create_thread_for_an_existing_thread_is_rejected_not_a_key_error() -> None:
    world = started()
    assert world.send("t", create()).disposition.startswith("rejected:unexpected_CreateThread")


# --- threads and turns ---------------------------------------------------------------


def test_create_thread_appends_the_initial_message_and_requests_a_completion() -> None:
    world = started()
    state = world.state("t")
    assert state.status is Status.AWAITING_MODEL
    assert isinstance(world.bodies("t")[0], UserEntry)
    assert world.requests[-1].request_id == state.pending_request
    assert world.requests[-1].history_len == 1
    assert world.kinds("t")[:2] == ["thread_created", "completion_requested"]


def test_first_user_message_creates_the_thread_when_the_default_config_allows() -> None:
    world = World(default_config=config())
    assert world.send("t", user("hi")).disposition == "applied"
    assert world.state("t").status is Status.AWAITING_MODEL


def test_user_message_for_an_unknown_thread_without_default_config_is_rejected() -> None:
    world = World()
    assert world.send("t", user("hi")).disposition == "rejected:unknown_thread"
    world = World(default_config=config(allow_implicit_create=False))
    assert world.send("t", user("hi")).disposition == "rejected:unknown_thread"
    assert world.states["t"] is None


def test_completion_without_calls_commits_the_turn_and_goes_idle() -> None:
    world = started()
    receipt = world.reply("t", "hello back")
    assert receipt.turn_commit and receipt.disposition == "applied"
    assert world.state("t").status is Status.IDLE
    assert isinstance(world.bodies("t")[-1], AssistantEntry)


def test_parallel_calls_are_all_dispatched_and_the_next_completion_waits_for_all() -> None:
    world = started()
    with_call(world, ("c1", "search", {"q": "a"}), ("c2", "fetch", {}))
    receipt = world.receipts[-1]
    assert len(receipt.tool_request_ids) == 2 and receipt.turn_commit
    assert world.state("t").status is Status.AWAITING_TOOLS
    first = world.dispatch_for("t", "c1")
    assert first.arguments == json.dumps({"q": "a"}) and first.capability.tenant == "acme"
    requests = len(world.requests)
    world.send("t", result("c1", first.request_id))
    assert world.state("t").status is Status.AWAITING_TOOLS and len(world.requests) == requests
    world.send("t", result("c2", world.dispatch_for("t", "c2").request_id))
    assert world.state("t").status is Status.AWAITING_MODEL and len(world.requests) == requests + 1


def test_completion_for_a_request_no_longer_current_is_stale() -> None:
    world = started()
    old = world.request("t")
    world.send("t", user("actually, something else"))
    assert world.send("t", completion(old, "late")).disposition == "stale"


def test_completion_error_parks_the_thread_and_unpark_asks_again() -> None:
    world = started()
    error = CompletionError(kind="rate_limited", message="429", attempts=5)
    receipt = world.send("t", completion(world.request("t"), error=error))
    assert receipt.disposition == "parked" and receipt.reason and "rate_limited" in receipt.reason
    assert world.state("t").status is Status.PARKED
    world.send("t", control("unpark"))
    assert world.state("t").status is Status.AWAITING_MODEL


def test_max_turns_budget_parks_instead_of_asking_again() -> None:
    world = started(max_turns=1)
    with_call(world, ("c1", "fetch", {}))
    world.send("t", result("c1", world.dispatch_for("t", "c1").request_id))
    assert world.state("t").status is Status.PARKED
    assert world.state("t").park_reason == "budget max_turns reached"


# --- refused calls -------------------------------------------------------------------


def test_unknown_tool_injects_an_error_and_asks_the_model_again() -> None:
    world = started()
    with_call(world, ("c1", "nope", {}))
    refused = results(world)[-1]
    assert refused.origin == "error" and not refused.ok and "does not exist" in refused.content[0].text  # type: ignore[union-attr]
    assert world.state("t").status is Status.AWAITING_MODEL
    assert world.dispatches == []


def test_reserved_names_are_refused() -> None:
    world = started()
    with_call(world, ("c1", INJECTED_TOOL, {}), ("c2", "anything__injected", {}))
    texts = [r.content[0].text for r in results(world)]  # type: ignore[union-attr]
    assert texts[0] == b.RESERVED_CALL and "reserved" in texts[1]


def test_arguments_failing_the_schema_are_refused() -> None:
    world = started()
    with_call(world, ("c1", "search", {"q": 3}))
    assert "invalid arguments" in results(world)[-1].content[0].text  # type: ignore[union-attr]
    world.reply("t", "again", (call("c2", "search", "not json"),))
    assert results(world)[-1].origin == "error"


def test_a_tool_outside_the_capability_is_refused() -> None:
    world = started()
    with_call(world, ("c1", "secret", {}))
    assert "not allowed" in results(world)[-1].content[0].text  # type: ignore[union-attr]


def test_an_expired_capability_refuses_every_tool_call() -> None:
    world = started(expires_at=0)
    with_call(world, ("c1", "fetch", {}))
    assert results(world)[-1].content[0].text == b.CAPABILITY_EXPIRED  # type: ignore[union-attr]


def test_invalid_calls_past_the_budget_park_the_thread_loudly() -> None:
    world = started(max_invalid_calls=1)
    with_call(world, ("c1", "nope", {}))
    assert world.state("t").status is Status.AWAITING_MODEL
    with_call(world, ("c2", "nope", {}))
    receipt = world.receipts[-1]
    assert receipt.disposition == "parked" and "max_invalid_calls" in (receipt.reason or "")
    assert "parked" in world.kinds("t")


# --- dedup, staleness, provenance ----------------------------------------------------


def test_a_repeated_message_id_is_a_duplicate_and_changes_nothing() -> None:
    world = started()
    before = world.state("t")
    receipt = world.send("t", user("again"), message_id="m1")
    assert receipt.disposition == "duplicate" and world.state("t") == before
    assert receipt.history_before == receipt.history_after == before.head


def test_a_result_for_an_answered_call_is_a_duplicate() -> None:
    world = started()
    with_call(world, ("c1", "fetch", {}))
    request = world.dispatch_for("t", "c1").request_id
    world.send("t", result("c1", request), message_id="r1")
    assert world.send("t", result("c1", request), message_id="r2").disposition == "duplicate"


def test_a_result_for_a_call_never_made_is_stale() -> None:
    world = started()
    with_call(world, ("c1", "fetch", {}))
    assert world.send("t", result("zz", "whatever")).disposition == "stale"
    assert world.send("t", result("c1", "wrong-request")).disposition == "stale"


def test_forged_expired_and_unbound_inputs_are_rejected_and_not_remembered() -> None:
    world = started()
    for verdict in ("forged", "expired", "unbound"):
        assert (
            world.send("t", user("x"), message_id="mx", provenance=verdict).disposition
            == f"rejected:{verdict}"
        )
    assert world.send("t", user("x"), message_id="mx").disposition == "applied"


# --- interruption --------------------------------------------------------------------


def test_user_text_while_tool_pending_interrupts_the_call() -> None:
    world = started()
    with_call(world, ("c1", "fetch", {}))
    request = world.dispatch_for("t", "c1").request_id
    world.send("t", user("stop that"))
    interrupted = results(world)[-1]
    assert interrupted.origin == "interrupted" and interrupted.call_id == "c1"
    assert world.dispatch_for("t", "c1", kind="cancel").tool == "fetch"
    last = world.bodies("t")[-1]
    assert isinstance(last, UserEntry) and last.interrupt
    assert world.state("t").status is Status.AWAITING_MODEL
    assert world.send("t", result("c1", request)).disposition == "stale"


def test_user_text_mid_completion_supersedes_the_request() -> None:
    world = started()
    old = world.request("t")
    world.send("t", user("more"))
    new = world.request("t")
    assert new != old and "interrupted" in world.kinds("t")
    assert world.requests[-1].history_len == 2


# --- deferral ------------------------------------------------------------------------


def subscribed(world: World) -> str:
    """Make call w1 a live subscription; returns its request id. Leaves the thread awaiting the model."""
    with_call(world, ("w1", "watch", {}))
    request = world.dispatch_for("t", "w1").request_id
    world.send("t", result("w1", request, "watching", subscription=True))
    return request


def test_event_while_call_pending_is_deferred_and_released_in_order() -> None:
    world = started()
    sub = subscribed(world)
    world.reply("t", "fetching", (call("c1", "fetch", {}),))
    first = world.send("t", event("w1", sub, 1, "one", associative=True))
    second = world.send("t", event("w1", sub, 2, "two", associative=True))
    assert first.disposition == second.disposition == "deferred"
    assert len(world.state("t").deferred) == 2
    world.send("t", result("c1", world.dispatch_for("t", "c1").request_id))
    injected = [e for e in world.bodies("t") if isinstance(e, EventEntry)]
    assert [e.content[0].text for e in injected] == ["one", "two"]  # type: ignore[union-attr]
    assert all(e.original_tool_call_id == "w1" and e.original_tool_name == "watch" for e in injected)
    assert world.kinds("t").count("released") == 2 and world.state("t").deferred == ()
    assert world.state("t").status is Status.AWAITING_MODEL


def test_a_stale_result_while_events_are_deferred_does_not_release_them() -> None:
    world = started()
    sub = subscribed(world)
    world.reply("t", "fetching", (call("c1", "fetch", {}),))
    world.send("t", event("w1", sub, 1, associative=True))
    assert world.send("t", result("zz", "nope")).disposition == "stale"
    assert len(world.state("t").deferred) == 1


def test_a_child_report_while_a_call_is_pending_is_deferred() -> None:
    world = started()
    with_call(world, ("s1", "spawn_thread", {"instructions": "go"}), ("c1", "fetch", {}))
    child = world.children("t")[0]
    world.reply(child, "reporting", (call("k1", "report_to_parent", {"report": "half done"}),))
    assert [r.disposition for r in world.receipts if r.thread_id == "t"][-1] == "deferred"
    world.send("t", result("c1", world.dispatch_for("t", "c1").request_id))
    injected = [e for e in world.bodies("t") if isinstance(e, EventEntry)]
    assert injected[-1].kind == "child_report" and "half done" in injected[-1].content[0].text  # type: ignore[union-attr]


def test_events_arriving_mid_completion_wait_for_the_turn() -> None:
    world = started()
    sub = subscribed(world)
    assert world.send("t", event("w1", sub, 1, associative=True)).disposition == "deferred"
    world.reply("t", "ok")
    assert isinstance(world.bodies("t")[-1], EventEntry)
    assert world.state("t").status is Status.AWAITING_MODEL


# --- subscriptions and events --------------------------------------------------------


def test_subscription_events_dedup_by_sequence_and_final_ends_it() -> None:
    world = started()
    sub = subscribed(world)
    world.reply("t", "ok")
    assert world.send("t", event("w1", sub, 1, associative=True)).disposition == "applied"
    world.reply("t", "ok")
    assert world.send("t", event("w1", sub, 1, associative=True)).disposition == "duplicate"
    assert world.send("t", event("w1", sub, 0, associative=True)).disposition == "duplicate"
    assert world.send("t", event("w1", sub, 2, associative=True, final=True)).disposition == "applied"
    assert world.state("t").subscriptions == ()
    assert world.send("t", event("w1", sub, 3, associative=True)).disposition == "stale"
    assert world.send("t", event("nope", sub, 1)).disposition == "stale"


def test_a_non_associative_event_is_handled_by_a_temporary_child() -> None:
    world = started()
    sub = subscribed(world)
    world.reply("t", "ok")
    parent_len = world.state("t").history_len
    world.send("t", event("w1", sub, 1, "ping"))
    assert world.state("t").history_len == parent_len  # the parent does not see it
    child = world.children("t")[0]
    link = world.state(child).config.parent
    assert link is not None and link.kind == "event" and link.spawn_call_id == "w1"
    last = world.bodies(child)[-1]
    assert isinstance(last, EventEntry) and last.original_tool_name == "watch"
    assert world.bodies(child)[:parent_len] == world.bodies("t")[:parent_len]
    world.reply(child, "handled", (call("x", "close_thread", {}),))  # silent close
    assert world.state(child).status is Status.CLOSED
    assert world.children("t") == [] and world.state("t").history_len == parent_len


def test_an_event_child_closing_with_a_report_tells_the_parent() -> None:
    world = started()
    sub = subscribed(world)
    world.reply("t", "ok")
    world.send("t", event("w1", sub, 1, "ping"))
    child = world.children("t")[0]
    world.reply(child, "handled", (call("x", "close_thread", {"report": "pong"}),))
    last = world.bodies("t")[-1]
    assert isinstance(last, EventEntry) and "remains active" in last.content[0].text  # type: ignore[union-attr]


# --- built-ins -----------------------------------------------------------------------


def test_spawn_thread_creates_a_child_with_the_parent_context_and_answers_at_once() -> None:
    world = started()
    with_call(world, ("s1", "spawn_thread", {"instructions": "research X"}))
    child = world.children("t")[0]
    spawned = results(world)[0]
    assert spawned.origin == "builtin" and child in spawned.content[0].text  # type: ignore[union-attr]
    assert world.state("t").status is Status.AWAITING_MODEL
    child_bodies = world.bodies(child)
    assert child_bodies[:2] == world.bodies("t")[:2]  # inherited up to and including the spawning turn
    inside = child_bodies[2]
    assert isinstance(inside, ToolResultEntry) and inside.call_id == "s1"
    assert "INSIDE" in inside.content[0].text and "research X" in inside.content[0].text  # type: ignore[union-attr]
    assert world.state(child).status is Status.AWAITING_MODEL
    assert world.state(child).config.parent.depth == 1  # type: ignore[union-attr]


def test_a_confused_child_re_running_its_parents_spawn_is_refused() -> None:
    world = started()
    with_call(world, ("s1", "spawn_thread", {"instructions": "research X"}))
    child = world.children("t")[0]
    world.reply(child, "spawning", (call("s1", "spawn_thread", {"instructions": "research X"}),))
    assert results(world, child)[-1].content[0].text == b.CONFUSED_CHILD  # type: ignore[union-attr]
    world.reply(child, "spawning", (call("s9", "spawn_thread", {"instructions": "research X"}),))
    assert results(world, child)[-1].content[0].text == b.CONFUSED_CHILD  # type: ignore[union-attr]
    assert world.state(child).children == ()


def test_every_child_ends_with_exactly_one_terminal_report() -> None:
    world = started()
    with_call(world, ("s1", "spawn_thread", {"instructions": "go"}))
    world.reply("t", "waiting")
    child = world.children("t")[0]
    world.reply(child, "progress", (call("k1", "report_to_parent", {"report": "step 1"}),))
    world.reply("t", "noted")
    world.reply(child, "bye", (call("k2", "close_thread", {"report": "all done"}),))
    reports = [e for e in world.bodies("t") if isinstance(e, EventEntry)]
    assert "step 1" in reports[0].content[0].text  # type: ignore[union-attr]
    assert "has shut down" in reports[1].content[0].text and "all done" in reports[1].content[0].text  # type: ignore[union-attr]
    assert world.children("t") == []
    terminal = [i for i in world.inputs if isinstance(i.body, ChildReport) and i.body.kind != "report"]
    assert len(terminal) == 1
    world.send(child, control("stop"))  # a closed child never reports again
    terminal = [i for i in world.inputs if isinstance(i.body, ChildReport) and i.body.kind != "report"]
    assert len(terminal) == 1


def test_two_close_thread_calls_in_one_turn_close_once_with_the_first_report() -> None:
    world = started()
    with_call(world, ("s1", "spawn_thread", {"instructions": "go"}))
    world.reply("t", "waiting")
    child = world.children("t")[0]
    world.reply(child, "bye", (call("k1", "close_thread", {"report": "the first"}),
                               call("k2", "close_thread", {"report": "the second"})))
    answers = {r.call_id: (r.ok, r.content[0].text) for r in results(world, child)}  # type: ignore[union-attr]
    assert answers["k1"] == (True, b.THREAD_CLOSED) and answers["k2"] == (False, b.ALREADY_CLOSING)
    terminal = [i.body for i in world.inputs if isinstance(i.body, ChildReport) and i.body.kind != "report"]
    assert len(terminal) == 1 and "the first" in terminal[0].text and "the second" not in terminal[0].text


def test_the_root_cannot_report_or_close() -> None:
    world = started()
    with_call(world, ("k1", "report_to_parent", {"report": "x"}), ("k2", "close_thread", {}))
    texts = [r.content[0].text for r in results(world)]  # type: ignore[union-attr]
    assert texts == [b.REPORT_FROM_ROOT, b.CLOSE_ROOT]
    assert world.state("t").status is Status.AWAITING_MODEL


def test_send_message_to_child_reaches_direct_children_only() -> None:
    world = started()
    with_call(world, ("s1", "spawn_thread", {"instructions": "go"}))
    child = world.children("t")[0]
    world.reply(child, "waiting")
    world.reply(
        "t",
        "telling",
        (
            call("m1", "send_message_to_child", {"thread_id": child, "message": "hurry"}),
            call("m2", "send_message_to_child", {"thread_id": "stranger", "message": "x"}),
        ),
    )
    texts = [r.content[0].text for r in results(world)]  # type: ignore[union-attr]
    assert texts[-2] == b.message_sent(child) and texts[-1] == b.not_a_child("stranger")
    last = world.bodies(child)[-1]
    assert isinstance(last, EventEntry) and last.kind == "parent_message" and "hurry" in last.content[0].text  # type: ignore[union-attr]
    assert last.original_tool_call_id == "s1"


def test_a_parent_message_from_a_stranger_is_rejected() -> None:
    world = started()
    body = ParentMessage(parent_thread_id="x", spawn_call_id="y", text="hi")
    assert world.send("t", body).disposition == "rejected:not_from_parent"


def test_cancel_subscription_cancels_own_subscriptions_only() -> None:
    world = started()
    subscribed(world)
    world.reply(
        "t",
        "cancelling",
        (
            call("x1", "cancel_subscription", {"call_id": "w1"}),
            call("x2", "cancel_subscription", {"call_id": "other"}),
        ),
    )
    texts = [r.content[0].text for r in results(world)]  # type: ignore[union-attr]
    assert texts[-2] == b.subscription_cancelled("w1") and texts[-1] == b.not_a_subscription("other")
    assert world.dispatch_for("t", "w1", kind="cancel").tool == "watch"
    assert world.state("t").subscriptions == ()


def test_sleep_dispatches_to_the_timer_and_timer_fired_answers_it() -> None:
    world = started()
    with_call(world, ("z1", "sleep", {"seconds": 30}))
    dispatch = world.dispatch_for("t", "z1")
    assert dispatch.tool == b.TIMER_TOOL
    assert json.loads(dispatch.arguments)["due_at"] == world.clock + 30_000
    fired = TimerFired(call_id="z1", request_id=dispatch.request_id, due_at=world.clock + 30_000)
    assert world.send("t", fired, message_id="tm1").disposition == "applied"
    assert results(world)[-1].content[0].text == b.slept(30)  # type: ignore[union-attr]
    assert world.send("t", fired, message_id="tm2").disposition == "duplicate"


def test_a_sleep_past_what_a_timer_can_carry_is_refused_like_a_bad_argument() -> None:
    """A timer's due time travels as an Avro long (ms). `1e300` seconds made a dispatch no
    codec could write (outside the step's per-input protection) and 400 digits parked the
    thread (review of 6616c8e); the longest sleep allowed still makes a dispatch that encodes."""
    world = started()
    with_call(world, ("z1", "sleep", {"seconds": 1e300}), ("z2", "sleep", {"seconds": 10**400}),
              ("z3", "sleep", {"seconds": MAX_SLEEP_SECONDS}))
    refused = [r for r in results(world) if r.call_id in ("z1", "z2")]
    assert [r.origin for r in refused] == ["error", "error"]
    assert all("seconds is too large" in r.content[0].text for r in refused)  # type: ignore[union-attr]
    longest = world.dispatch_for("t", "z3")
    assert json.loads(longest.arguments)["due_at"] == world.clock + MAX_SLEEP_SECONDS * 1000
    assert decode_value(encode_value(longest), Dispatch) == longest
    assert world.state("t").status is Status.AWAITING_TOOLS


def test_sleep_until_parses_iso_times_and_refuses_nonsense() -> None:
    world = started()
    with_call(
        world,
        ("z1", "sleep_until", {"time": "2027-01-01T00:00:00+00:00"}),
        ("z2", "sleep_until", {"time": "soon"}),
    )
    assert json.loads(world.dispatch_for("t", "z1").arguments)["due_at"] == 1798761600000
    assert results(world)[-1].origin == "error"


def test_an_event_ends_a_passive_sleep_instead_of_being_deferred() -> None:
    world = started()
    sub = subscribed(world)
    world.reply("t", "sleeping", (call("z1", "sleep", {"seconds": 600}),))
    assert world.send("t", event("w1", sub, 1, associative=True)).disposition == "applied"
    woke = results(world)[-1]
    assert woke.call_id == "z1" and woke.content[0].text == b.SLEEP_ENDED_BY_EVENT  # type: ignore[union-attr]
    assert world.dispatch_for("t", "z1", kind="cancel").tool == b.TIMER_TOOL
    assert isinstance(world.bodies("t")[-1], EventEntry)
    assert world.state("t").status is Status.AWAITING_MODEL


def test_any_input_ends_sleep_until_event_or_input() -> None:
    world = started()
    with_call(world, ("z1", "sleep_until_event_or_input", {}))
    assert world.state("t").status is Status.AWAITING_TOOLS and world.dispatches == []
    world.send("t", user("wake up"))
    assert results(world)[-1].content[0].text == b.SLEEP_ENDED_BY_INPUT  # type: ignore[union-attr]
    assert not world.bodies("t")[-1].interrupt  # type: ignore[attr-defined]


# --- approvals -----------------------------------------------------------------------


def approval(
    call_id: str, request_id: str, approval_id: str = "a1", expires_at: int | None = None
) -> ApprovalRequest:
    return ApprovalRequest(
        approval_id=approval_id,
        call_id=call_id,
        request_id=request_id,
        prompt="Delete?",
        choices=("yes", "no"),
        default_choice="no",
        expires_at=expires_at,
    )


def test_approval_requests_are_kept_and_a_valid_decision_is_dispatched_back() -> None:
    world = started()
    with_call(world, ("c1", "fetch", {}))
    request = world.dispatch_for("t", "c1").request_id
    assert world.send("t", approval("c1", request)).disposition == "applied"
    assert world.send("t", approval("c1", request, "a2")).disposition == "applied"
    assert len(world.state("t").approvals) == 2 and world.kinds("t").count("approval_requested") == 2
    decision = ApprovalDecision(approval_id="a1", choice="maybe", decided_by="user:bob")
    assert world.send("t", decision).disposition == "rejected:invalid_choice"
    decision = ApprovalDecision(approval_id="a1", choice="yes", decided_by="user:bob")
    assert world.send("t", decision).disposition == "applied"
    sent = world.dispatch_for("t", "c1", kind="approval_decision")
    # Who decided is the input's source (what its key vouches for), not what the body claims.
    assert json.loads(sent.arguments) == {"approval_id": "a1", "choice": "yes", "decided_by": "user:alice"}
    assert (
        world.send("t", ApprovalDecision("a1", "yes", "user:bob")).disposition == "rejected:unknown_approval"
    )


def test_expired_and_unbound_approvals_are_refused() -> None:
    world = started()
    with_call(world, ("c1", "fetch", {}))
    request = world.dispatch_for("t", "c1").request_id
    assert world.send("t", approval("zz", request)).disposition == "stale"
    world.send("t", approval("c1", request, expires_at=0))
    assert world.send("t", ApprovalDecision("a1", "yes", "u")).disposition == "rejected:approval_expired"


def test_a_result_dismisses_the_calls_pending_approvals() -> None:
    world = started()
    with_call(world, ("c1", "fetch", {}))
    request = world.dispatch_for("t", "c1").request_id
    world.send("t", approval("c1", request))
    world.send("t", result("c1", request))
    assert world.state("t").approvals == () and "approval_dismissed" in world.kinds("t")


# --- compaction ----------------------------------------------------------------------


def compacted(world: World, thread: str, summary: str) -> str:
    """Let the thread's compaction child summarise; returns the child's id."""
    compaction = world.state(thread).compaction
    assert compaction is not None
    child = compaction.child_thread_id
    world.reply(child, "summary", (call("cl", "close_thread", {"report": summary}),))
    return child


def test_compaction_past_the_threshold_appends_a_summary_and_resets_usage() -> None:
    world = started(context_window=1000)
    world.reply("t", "big answer", total_tokens=800)
    compaction = world.state("t").compaction
    assert compaction is not None and compaction.up_to_seq == 2
    child = compaction.child_thread_id
    assert world.state(child).config.parent.kind == "compaction"  # type: ignore[union-attr]
    assert isinstance(world.bodies(child)[-1], UserEntry)
    compacted(world, "t", "we said hello")
    summary = world.bodies("t")[-1]
    assert isinstance(summary, SummaryEntry) and summary.up_to_seq == 2 and summary.text == "we said hello"
    assert world.state("t").last_total_tokens == 0 and world.state("t").compaction is None
    assert world.state("t").status is Status.IDLE  # a summary is not something to answer
    # a second compaction works too
    world.send("t", user("more"))
    world.reply("t", "again big", total_tokens=900)
    second = world.state("t").compaction
    assert second is not None
    assert isinstance(world.bodies(second.child_thread_id)[0], SummaryEntry)
    compacted(world, "t", "second summary")
    assert [e.text for e in world.bodies("t") if isinstance(e, SummaryEntry)] == [
        "we said hello",
        "second summary",
    ]


def test_a_compaction_child_that_answers_in_text_has_written_its_summary() -> None:
    world = started(context_window=1000)
    world.reply("t", "big answer", total_tokens=800)
    compaction = world.state("t").compaction
    assert compaction is not None
    world.reply(compaction.child_thread_id, "we said hello")  # no close_thread call
    assert world.state(compaction.child_thread_id).status is Status.CLOSED
    summary = world.bodies("t")[-1]
    assert isinstance(summary, SummaryEntry) and summary.text == "we said hello"
    assert world.state("t").compaction is None
    assert world.send("t", control("compact")).disposition == "applied"  # not stuck in progress


def test_a_compaction_child_that_answers_with_nothing_fails_the_compaction_and_frees_it() -> None:
    world = started(context_window=1000)
    world.reply("t", "big answer", total_tokens=800)
    compaction = world.state("t").compaction
    assert compaction is not None
    world.reply(compaction.child_thread_id, "")
    assert world.state("t").compaction is None and "compaction_failed" in world.kinds("t")
    assert not any(isinstance(e, SummaryEntry) for e in world.bodies("t"))


def test_compaction_while_a_call_is_pending_never_cuts_the_call() -> None:
    world = started()
    with_call(world, ("c1", "fetch", {}))
    assert world.send("t", control("compact")).disposition == "applied"
    compaction = world.state("t").compaction
    assert compaction is not None and compaction.up_to_seq == 1  # before the pending turn
    child = compaction.child_thread_id
    assert not any(isinstance(e, AssistantEntry) for e in world.bodies(child))
    assert world.send("t", control("compact")).disposition == "rejected:compaction_in_progress"
    compacted(world, "t", "summary")
    assert isinstance(world.bodies("t")[-1], SummaryEntry)
    assert world.state("t").status is Status.AWAITING_TOOLS
    world.send("t", result("c1", world.dispatch_for("t", "c1").request_id))
    assert world.state("t").status is Status.AWAITING_MODEL


def test_compaction_inside_a_child_works() -> None:
    world = started()
    with_call(world, ("s1", "spawn_thread", {"instructions": "go"}))
    child = world.children("t")[0]
    world.reply(child, "ok")
    world.send(child, control("compact"))
    compacted(world, child, "child summary")
    assert isinstance(world.bodies(child)[-1], SummaryEntry)


# --- operator control ----------------------------------------------------------------


def test_stop_is_a_durable_tombstone_that_cancels_everything() -> None:
    world = started()
    sub = subscribed(world)
    world.reply(
        "t",
        "working",
        (
            call("s1", "spawn_thread", {"instructions": "go"}),
            call("c1", "fetch", {}),
            call("z1", "sleep", {"seconds": 5}),
        ),
    )
    child = world.children("t")[0]
    assert world.send("t", control("stop", reason="enough")).disposition == "applied"
    state = world.state("t")
    assert state.status is Status.STOPPED and state.pending_calls == () and state.subscriptions == ()
    cancels = {(d.call_id, d.tool) for d in world.dispatches if d.kind == "cancel"}
    assert {("c1", "fetch"), ("z1", b.TIMER_TOOL), ("w1", "watch")} <= cancels
    assert world.state(child).status is Status.STOPPED  # stopped via a loopback Control stop
    assert world.children("t") == []  # and its terminal `stopped` report was absorbed
    assert world.send("t", user("hello?")).disposition == "stopped"
    assert world.send("t", event("w1", sub, 5)).disposition == "stopped"
    world.send("t", control("resume"))
    assert world.state("t").status is Status.AWAITING_MODEL  # the stopped calls need an answer


def test_a_child_closing_while_its_parent_is_stopped_is_absorbed() -> None:
    world = started()
    with_call(world, ("s1", "spawn_thread", {"instructions": "go"}))
    child = world.children("t")[0]
    world.auto_deliver = False
    world.send("t", control("stop"))
    world.queue.clear()  # the stop has not reached the child yet
    world.reply(child, "bye", (call("k", "close_thread", {"report": "done"}),))
    report = world.queue.popleft()
    assert world.deliver(report).disposition == "stopped"
    assert world.children("t") == []


def test_park_holds_inputs_and_unpark_folds_them_in_order() -> None:
    world = started()
    with_call(world, ("c1", "fetch", {}))
    world.send("t", control("park", reason="inspect"))
    request = world.dispatch_for("t", "c1").request_id
    assert world.send("t", result("c1", request)).disposition == "parked"
    assert world.send("t", user("hi")).disposition == "parked"
    assert world.send("t", user("hi"), message_id="m-dup").disposition == "parked"
    assert world.send("t", user("hi"), message_id="m-dup").disposition == "duplicate"
    world.send("t", control("unpark"))
    bodies = world.bodies("t")
    assert isinstance(bodies[-3], ToolResultEntry) and bodies[-3].origin == "tool"
    assert isinstance(bodies[-1], UserEntry)
    assert world.state("t").status is Status.AWAITING_MODEL and world.state("t").deferred == ()


def test_park_on_failure_parks_with_the_reason() -> None:
    world = started()
    record = world.envelope("t", user("poison"))
    transition = park_on_failure(world.state("t"), record, "ValueError: boom", 3)
    assert transition.state is not None and transition.state.status is Status.PARKED
    receipt = transition.effects[-1].receipt  # type: ignore[union-attr]
    assert receipt.disposition == "parked" and receipt.retry_count == 3 and "boom" in (receipt.reason or "")


def test_cancel_call_answers_the_call_and_tells_the_connector() -> None:
    world = started()
    with_call(world, ("c1", "fetch", {}))
    assert world.send("t", control("cancel_call", call_id="c1")).disposition == "applied"
    assert results(world)[-1].content[0].text == b.CANCELLED_BY_OPERATOR  # type: ignore[union-attr]
    assert world.dispatch_for("t", "c1", kind="cancel")
    assert world.send("t", control("cancel_call", call_id="zz")).disposition == "rejected:unknown_call"


def test_set_model_applies_from_the_next_completion() -> None:
    world = started()
    world.send("t", control("set_model", model="bigger"))
    assert world.requests[-1].model == "scripted"
    world.reply("t", "ok")
    world.send("t", user("next"))
    assert world.requests[-1].model == "bigger"


def test_delete_removes_the_state_and_cancels_work() -> None:
    world = started()
    with_call(world, ("c1", "fetch", {}))
    receipt = world.send("t", control("delete"))
    assert receipt.disposition == "applied" and world.states["t"] is None
    assert world.dispatch_for("t", "c1", kind="cancel")
    assert world.send("t", user("x")).disposition == "rejected:unknown_thread"


def test_unknown_and_misplaced_commands_are_rejected() -> None:
    world = started()
    assert world.send("t", control("dance")).disposition == "rejected:unknown_command"
    assert world.send("t", control("resume")).disposition == "rejected:not_stopped"
    assert world.send("t", control("unpark")).disposition == "rejected:not_parked"


# --- receipts and the hash chain -----------------------------------------------------


def test_receipts_carry_heads_versions_and_authority() -> None:
    world = started()
    first = world.receipts[0]
    assert first.history_before == GENESIS_HEAD and first.thread_version == 1
    assert first.history_after == chain(tuple(world.histories["t"]))
    assert first.authority_snapshot is not None and first.runtime_build
    assert first.input_partition is None and first.input_offset is None
    second = world.reply("t", "hi")
    assert second.history_before == first.history_after and second.thread_version == 2
    assert world.state("t").head == chain(tuple(world.histories["t"]))


def test_a_receipt_says_where_the_shell_read_its_input_and_nothing_else_depends_on_it() -> None:
    world = started()
    record = world.envelope("t", user("where"), "m-where", "user:alice")
    state = world.states["t"]
    here, nowhere = fold(state, record, Facts(partition=3, offset=41)), fold(state, record, Facts())
    placed, unplaced = here.effects[-1], nowhere.effects[-1]
    assert isinstance(placed, EmitReceipt) and isinstance(unplaced, EmitReceipt)
    assert (placed.receipt.input_partition, placed.receipt.input_offset) == (3, 41)
    assert (unplaced.receipt.input_partition, unplaced.receipt.input_offset) == (None, None)
    assert dataclasses.replace(placed.receipt, input_partition=None, input_offset=None) == unplaced.receipt
    assert here.state == nowhere.state and here.effects[:-1] == nowhere.effects[:-1]


def test_the_receipts_and_events_the_fold_builds_field_by_field_are_whole_frozen_records() -> None:
    world = started()
    world.reply("t", "hi")
    built: list[object] = []
    for transition in world.transitions:
        for effect in transition.effects:
            if isinstance(effect, EmitReceipt):
                built.append(effect.receipt)
            elif isinstance(effect, EmitEvent):
                built.append(effect.event)
    assert {type(value).__name__ for value in built} == {"Receipt", "ThreadEvent"}
    for value in built:
        cls = type(value)
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        again = cls(**fields)
        assert again == value and hash(again) == hash(value)
        assert decode_value(encode_value(value), cls) == value
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.thread_id = "other"  # type: ignore[attr-defined]


def test_create_thread_with_inherited_entries_renumbers_them_from_zero() -> None:
    world = started()
    world.reply("t", "hi")
    inherited = tuple(world.histories["t"])
    child = Input(
        message_id="c-create",
        thread_id="c",
        created_at=5,
        source="processor",
        expires_at=None,
        key_id=None,
        signature=None,
        body=create(initial="continue").__class__(
            config=dataclasses.replace(config(), parent=ParentLink("t", "t", "s1", "child", 1)),
            inherited=inherited[1:], initial=(TextBlock("continue"),)
        ),
    )
    transition = fold(None, child, Facts())
    # The inherited turn (seq 1 in the parent) is the child's entry 0; a child's
    # instructions reach it through the spawn call's result, not as an entry here.
    assert transition.state is not None and transition.state.history_len == 1
    seqs = [e.entry.seq for e in transition.effects if hasattr(e, "entry") and not hasattr(e, "event")]
    assert seqs == [0]


def test_a_root_thread_that_brings_history_of_its_own_is_refused() -> None:
    world = started()
    world.reply("t", "hi")
    forged = dataclasses.replace(create(), inherited=tuple(world.histories["t"]))
    receipt = world.send("u", forged)
    assert receipt.disposition == "rejected:invalid_config"
    assert receipt.reason == "a root thread inherits no history (only a child the processor creates does)"
    assert world.states.get("u") is None


def test_every_input_gets_exactly_one_receipt_last() -> None:
    world = started()
    with_call(world, ("c1", "fetch", {}), ("s1", "spawn_thread", {"instructions": "x"}))
    for transition in world.transitions:
        receipts = [e for e in transition.effects if type(e).__name__ == "EmitReceipt"]
        assert len(receipts) == 1 and transition.effects[-1] is receipts[0]
    assert len(world.receipts) == len(world.inputs)


def test_tool_specs_of_the_builtins_are_valid_and_the_sleeps_passive() -> None:
    names = {spec.name for spec in b.BUILTIN_TOOLS}
    assert {
        "spawn_thread",
        "report_to_parent",
        "close_thread",
        "send_message_to_child",
        "cancel_subscription",
        "sleep",
        "sleep_until",
        "sleep_until_event_or_input",
    } == names
    assert {s.name for s in b.BUILTIN_TOOLS if s.passive} == {
        "sleep",
        "sleep_until",
        "sleep_until_event_or_input",
    }
    for spec in b.BUILTIN_TOOLS:
        json.loads(spec.parameters)
    assert SEARCH.name == "search" and FETCH.name == "fetch"


def test_a_re_sent_event_copy_is_a_duplicate_while_deferred_and_while_parked() -> None:
    world = started()
    sub = subscribed(world)
    assert world.send("t", event("w1", sub, 1, associative=True)).disposition == "deferred"
    assert world.send("t", event("w1", sub, 1, associative=True)).disposition == "duplicate"
    world.reply("t", "ok")
    world.send("t", control("park"))
    assert world.send("t", event("w1", sub, 2, associative=True)).disposition == "parked"
    assert world.send("t", event("w1", sub, 2, associative=True)).disposition == "parked"
    world.send("t", control("unpark"))
    world.reply("t", "ok")  # the held events wait for the turn in flight, then one copy applies
    injected = [e for e in world.bodies("t") if isinstance(e, EventEntry)]
    assert len(injected) == 2
    assert world.state("t").subscriptions[0].last_sequence == 2


def test_events_are_released_in_order_and_an_older_one_behind_them_is_a_duplicate() -> None:
    world = started()
    sub = subscribed(world)
    for sequence, disposition in ((1, "deferred"), (3, "deferred"), (2, "duplicate")):
        assert (
            world.send("t", event("w1", sub, sequence, f"e{sequence}", associative=True)).disposition
            == disposition
        )
    world.reply("t", "ok")
    texts = [e.content[0].text for e in world.bodies("t") if isinstance(e, EventEntry)]  # type: ignore[union-attr]
    assert texts == ["e1", "e3"]


def test_a_non_associative_event_does_not_wake_a_sleeping_parent() -> None:
    world = started()
    sub = subscribed(world)
    world.reply("t", "sleeping", (call("z1", "sleep_until_event_or_input", {}),))
    sleeping_turn = world.state("t").pending_turn_seq
    assert world.send("t", event("w1", sub, 1, "ping")).disposition == "applied"
    child = world.children("t")[0]
    assert world.state("t").pending_calls[0].call_id == "z1"  # still asleep
    assert (
        len(world.histories[child]) == sleeping_turn + 1
    )  # inherited up to the sleeping turn, then the event
    world.reply(child, "handled", (call("x", "close_thread", {"report": "it pinged"}),))
    woke = results(world)[-1]
    assert woke.call_id == "z1" and woke.content[0].text == b.SLEEP_ENDED_BY_EVENT  # type: ignore[union-attr]
    assert world.state("t").status is Status.AWAITING_MODEL


def test_a_timer_for_a_sleep_ended_early_is_stale() -> None:
    world = started()
    with_call(world, ("z1", "sleep", {"seconds": 60}))
    dispatch = world.dispatch_for("t", "z1")
    world.send("t", user("awake?"))
    fired = TimerFired(call_id="z1", request_id=dispatch.request_id, due_at=0)
    assert world.send("t", fired).disposition == "stale"


def test_the_max_children_budget_refuses_more_spawns() -> None:
    world = started(max_children=1)
    with_call(
        world, ("s1", "spawn_thread", {"instructions": "a"}), ("s2", "spawn_thread", {"instructions": "b"})
    )
    assert results(world)[-1].content[0].text == b.TOO_MANY_CHILDREN  # type: ignore[union-attr]
    assert len(world.children("t")) == 1


def test_a_stopped_child_sends_its_one_terminal_report_and_resume_does_not_repeat_it() -> None:
    world = started()
    with_call(world, ("s1", "spawn_thread", {"instructions": "a"}))
    child = world.children("t")[0]
    world.send(child, control("stop"))
    assert [r.disposition for r in world.receipts if r.thread_id == "t"][
        -1
    ] == "deferred"  # a turn is in flight
    world.reply("t", "ok")
    assert world.children("t") == []
    reports = [e for e in world.bodies("t") if isinstance(e, EventEntry)]
    assert reports and "was stopped" in reports[-1].content[0].text  # type: ignore[union-attr]
    world.send(child, control("resume"))
    world.reply(child, "bye", (call("k", "close_thread", {"report": "x"}),))
    terminal = [i for i in world.inputs if isinstance(i.body, ChildReport) and i.body.kind != "report"]
    assert len(terminal) == 1
