"""The fold: the pure thread state machine. Every status transition lives in this file.

`fold(state, input, facts) -> Transition` decides what one input does to one thread. It
reads no clock, store, environment or random source: "now" is `input.created_at`, new
ids derive from `input.message_id`, and what the shell looked up first comes in `facts`.
Re-folding a thread's inputs therefore reproduces its history and hash chain byte for
byte.

How it works:

1. Guards common to every input: a seen message id is a `duplicate`; a forged, expired,
   unbound or invalid input, or an unsigned one from a source that must sign (reason
   `missing_signature`), is `rejected:<provenance>` with the verifier's reason as the
   receipt's; an unknown thread accepts only
   `CreateThread` (or a first `UserMessage` when `facts.default_config` allows it).
2. `TRANSITIONS[(status, type(body))]` picks the handler `on_<body>`. Each handler runs
   its guards (stale, duplicate-by-call, wrong sender), then changes the state through
   the `Draft` (which changes its own copy of the state in place) and appends effects. It returns the
   disposition. Handlers never request a completion themselves.
3. After an `applied` input, `_settle` releases deferred inputs that may now run (each
   folded through the same table, narrated by a `released` event, with no receipt of
   its own), then requests one completion if history holds input the model has not
   answered and nothing is pending, and derives the status.
4. `_finish` bumps `thread_version` when the state changed, remembers the message id
   (every verdict counts, rejections too: a copy arriving after the state moved on must
   not be judged again; only a provenance rejection is not remembered, because the
   genuine record with that id may still come, and nothing is remembered for a thread
   that does not exist), and appends
   the one receipt, last. The receipt is built in one place so "exactly one receipt,
   last" holds by construction, and released inputs reuse the handlers without one.

Statuses (wire names)::

                 CreateThread / first UserMessage
                               |
                               v
        +----------------->  idle  <---------------------+
        |   input needing       |                        | completion without calls,
        |   an answer           v                        | all calls settled, nothing owed
        |              awaiting_model ---- Completion ---+---> awaiting_tools
        |   (user text supersedes it)      with calls          |  results, timers,
        +-----------------------------------<------------------+  interruption
                                                                   (then awaiting_model)

    any of the three --Control park / completion error / invalid-call budget--> parked
    parked --Control unpark--> (derived from what is pending)
    any but closed --Control stop--> stopped --Control resume--> (derived)
    a child --close_thread--> closed            any --Control delete--> (no state)

While `parked`, inputs are held in the deferred queue (receipt `parked`) and released on
unpark; while `stopped`, they are absorbed (receipt `stopped`); `closed` refuses them.

Rules worth knowing (each has a test in `tests/processors/test_fold.py`):
- Events, child reports and parent messages are deferred while a completion is in flight
  or a non-passive call is pending (the model must not answer what it did not see), and
  released in order once nothing blocks them. A stale result releases nothing.
- User text interrupts: pending calls get an `interrupted` result and a cancel dispatch,
  a pending completion is superseded; late real answers are then stale.
- A passive call (the sleeps) is ended by any input or inline event (timer cancelled).
  A non-associative subscription event does not wake it: a temporary child handles the
  event from the safe point before the sleeping turn, and its report (if any) wakes it.
- A compaction summary is applied at once (never deferred) and asks the model nothing.
- A `fork` control is folded in every status and changes nothing on its thread: it asks
  the shell to create the fork, whose creation another fold judges (`forks.py`).
- Every judged input is remembered except provenance rejections (see step 4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Final, TypeVar

from torpor.processors.fold import builtins as b
from torpor.processors.fold.calls import CallOutcome, run_call
from torpor.processors.fold.children import (
    COMPACTION,
    TERMINAL_REPORTS,
)
from torpor.processors.fold.draft import Draft
from torpor.processors.fold.effects import Effect, EmitReceipt, RememberInput, Transition
from torpor.processors.fold.facts import Facts
from torpor.processors.fold.forks import FORK, fork_problem, on_create_fork, on_fork
from torpor.processors.fold.inbound import (
    on_approval_decision,
    on_approval_request,
    on_child_report,
    on_create_thread,
    on_parent_message,
    on_timer_fired,
    on_tool_event,
    on_tool_result,
    on_user_message,
)
from torpor.processors.fold.pending import (
    body_of,
    cancel_call,
    cancel_work,
    find_child,
    is_deferring,
    is_past_threshold,
    report_terminal,
    start_compaction,
    stop_children,
)
from torpor.processors.fold.receipts import build_receipt
from torpor.processors.fold.state import GENESIS_HEAD, Status, ThreadState
from torpor.schemas.ids import PREFIX as DERIVED_PREFIX
from torpor.schemas.jsontext import tool_spec_problem
from torpor.schemas.records import (
    APPLIED,
    DUPLICATE,
    EXPIRED,
    FORGED,
    INVALID,
    PARKED,
    STALE,
    STOPPED,
    UNBOUND,
    UNCHECKED,
    ApprovalDecision,
    ApprovalRequest,
    AssistantEntry,
    ChildReport,
    Completion,
    Control,
    CreateThread,
    Input,
    InputBody,
    ParentMessage,
    Receipt,
    TextBlock,
    TimerFired,
    ToolEvent,
    ToolResult,
    UserMessage,
    rejected,
)
from torpor.schemas.signing import MISSING_SIGNATURE

B = TypeVar("B", bound=InputBody)
Handler = Callable[[Draft], str]

REFUSED_PROVENANCE: Final = frozenset({FORGED, EXPIRED, UNBOUND, INVALID})
HALTED: Final = frozenset({Status.CLOSED, Status.STOPPED, Status.PARKED})
DEFERRABLE: Final = (ToolEvent, ChildReport, ParentMessage)


# --- the entry points ----------------------------------------------------------------


def fold(state: ThreadState | None, input: Input, facts: Facts) -> Transition:
    """Fold one input into one thread's state. Never raises on bad input: see the module doc."""
    if facts.seen:
        return _receipt_only(state, input, facts, DUPLICATE, "message id already seen")
    if facts.provenance in REFUSED_PROVENANCE or facts.provenance_reason == MISSING_SIGNATURE:
        return _receipt_only(state, input, facts, rejected(facts.provenance), facts.provenance_reason)
    if state is None:
        return _fold_absent(input, facts)
    if state.thread_id != input.thread_id:
        return _receipt_only(state, input, facts, rejected("wrong_thread"), None, remember=True)
    draft = Draft(state=state, origin=input, facts=facts, current=input)
    return _finish(draft, state, _run_row(draft))


def park_on_failure(state: ThreadState | None, input: Input, reason: str, attempts: int,
                    partition: int | None = None, offset: int | None = None) -> Transition:
    """Park the thread because folding (or processing) `input` failed `attempts` times.

    The shell calls this instead of retrying forever; the input itself goes to the
    `parked` topic. The receipt is `parked` with the reason, and says where the input was
    read (`partition`, `offset`: `Facts`).
    """
    facts = Facts(attempt=attempts, partition=partition, offset=offset)
    why = f"failed after {attempts} attempts: {reason}"
    if state is None:
        return _receipt_only(None, input, facts, PARKED, why, remember=True)
    draft = Draft(state=state, origin=input, facts=facts, current=input)
    draft.reason = why
    _park(draft, why)
    return _finish(draft, state, PARKED)


def refuse_at_door(input: Input, disposition: str, reason: str, partition: int | None = None,
                   offset: int | None = None) -> Receipt:
    """The receipt of an input refused before its thread was looked up (provenance `unchecked`),
    read at `partition` and `offset` (`Facts`).

    The shell's door (`step.door_problem`: ids, record key, partition) and its last
    resort when even parking failed. Nothing else happens: no state, nothing remembered.
    """
    facts = Facts(provenance=UNCHECKED, partition=partition, offset=offset)
    return build_receipt(input, facts, disposition, reason, None, None)


def refuse_whole(state: ThreadState | None, input: Input, facts: Facts, disposition: str,
                 reason: str) -> Receipt:
    """The receipt of an input the shell refused after folding it (`step`: its records would
    be too large for Kafka): judged like any input, its state unchanged, nothing remembered."""
    return build_receipt(input, facts, disposition, reason, state, state)


def _run_row(draft: Draft) -> str:
    handler = TRANSITIONS.get((draft.state.status, type(draft.current.body)), on_unexpected)
    return handler(draft)


def _receipt_only(state: ThreadState | None, input: Input, facts: Facts, disposition: str,
                  reason: str | None, remember: bool = False) -> Transition:
    receipt = build_receipt(input, facts, disposition, reason, state, state)
    effects: tuple[Effect, ...] = (RememberInput(input.message_id),) if remember else ()
    return Transition(state, (*effects, EmitReceipt(receipt)))


def _finish(draft: Draft, before: ThreadState | None, disposition: str) -> Transition:
    if disposition == APPLIED and not draft.deleted:
        _settle(draft)
    after: ThreadState | None = None if draft.deleted else draft.state
    if after is not None and (before is None or draft.is_changed_from(before)):
        after = draft.replace(version=(before.version if before else 0) + 1)
    receipt = build_receipt(draft.origin, draft.facts, disposition, draft.reason, before, after,
                            tuple(draft.tool_request_ids), draft.turn_commit)
    if draft.deleted:
        receipt = dataclasses.replace(receipt, history_after=GENESIS_HEAD)
    return Transition(after, (*draft.effects, RememberInput(draft.origin.message_id), EmitReceipt(receipt)))


def _fold_absent(input: Input, facts: Facts) -> Transition:
    body = input.body
    if isinstance(body, CreateThread):
        config = body.config
    elif isinstance(body, UserMessage) and facts.default_config is not None \
            and facts.default_config.allow_implicit_create:
        config = facts.default_config
    else:
        # Not remembered: a thread that does not exist keeps no rows at all.
        return _receipt_only(None, input, facts, rejected("unknown_thread"), None)
    # Tool schemas are judged when they are registered, not at the first call: a thread
    # is never created with a tool whose schema cannot be read (children copy the tools
    # of a parent that passed this check, so they pass it too).
    problem = next((f"{spec.name}: {why}" for spec in config.tools
                    if (why := tool_spec_problem(spec)) is not None), None)
    if config.parent is None and input.thread_id.startswith(DERIVED_PREFIX):
        # Derived ids name the processor's children: a root thread squatting one would
        # make the real child's creation fail (its id is computable from the outbox).
        problem = (f"thread ids starting with {DERIVED_PREFIX} are derived: only the processor's "
                   "children have one")
    if isinstance(body, CreateThread) and body.fork is not None:
        problem = problem or fork_problem(body, input.source)
    elif isinstance(body, CreateThread) and config.parent is None and body.inherited:
        # History is what this runtime folded: only the processor's own child or fork
        # creation carries some (the parent's, the source's), or a creator could write
        # turns, tool results and messages that no model, connector or parent produced.
        problem = "a root thread inherits no history (only a child the processor creates does)"
    if problem is not None:
        return _receipt_only(None, input, facts, rejected("invalid_config"), problem)
    state = ThreadState(
        thread_id=input.thread_id, status=Status.IDLE, version=0, config=config, model=config.model,
        history_len=0, head=GENESIS_HEAD, pending_request=None, pending_request_len=0, pending_calls=(),
        pending_turn_seq=None, answered_calls=(), subscriptions=(), deferred=(), approvals=(), children=(),
        compaction=None, owes_turn=False, turns=0, invalid_rounds=0, last_total_tokens=0, park_reason=None,
        stop_reason=None, spawn_arguments=None, terminal_reported=False)
    draft = Draft(state=state, origin=input, facts=facts, current=input)
    created: dict[str, object] = {"parent": config.parent.parent_thread_id if config.parent else None,
                                  "implicit": not isinstance(body, CreateThread)}
    if isinstance(body, CreateThread) and body.fork is not None:
        created["forked_from"] = {"thread_id": body.fork.source_thread_id, "at_seq": body.fork.at_seq,
                                  "control_id": body.fork.control_id, "requested_by": body.fork.requested_by}
    draft.emit("thread_created", data=created)
    if not isinstance(body, CreateThread):
        disposition = on_user_message(draft)
    else:
        disposition = on_create_thread(draft) if body.fork is None else on_create_fork(draft)
    return _finish(draft, None, disposition)


# --- status: derived in one place ----------------------------------------------------


def _derive_status(draft: Draft) -> None:
    state = draft.state
    if state.status in HALTED:
        return
    if state.pending_request is not None:
        status = Status.AWAITING_MODEL
    elif state.pending_calls:
        status = Status.AWAITING_TOOLS
    else:
        status = Status.IDLE
    draft.replace(status=status, pending_turn_seq=state.pending_turn_seq if state.pending_calls else None)


def _settle(draft: Draft) -> None:
    """Release what may run now, then ask the model if it owes an answer. See the module doc."""
    _derive_status(draft)
    _release(draft)
    state = draft.state
    if state.status in HALTED or state.pending_request is not None or state.pending_calls:
        _derive_status(draft)
        return
    if state.owes_turn:
        limit = state.config.budgets.max_turns
        if limit is not None and state.turns >= limit:
            draft.reason = "budget max_turns reached"
            _park(draft, draft.reason)
            return
        draft.request_completion()
        draft.replace(owes_turn=False)
    _derive_status(draft)


def _release(draft: Draft) -> None:
    """Fold deferred inputs that may run now, in order; events stay while still deferring."""
    progress = True
    while progress and draft.state.status not in HALTED:
        progress = False
        for index, held in enumerate(draft.state.deferred):
            if isinstance(held.body, DEFERRABLE) and is_deferring(draft.state):
                continue
            queue = draft.state.deferred
            draft.replace(deferred=queue[:index] + queue[index + 1:])
            _derive_status(draft)
            # The released input is folded through its own row; the outer receipt keeps its reason.
            outer, was_released, reason = draft.current, draft.released, draft.reason
            draft.current, draft.released = held, True
            disposition = _run_row(draft)
            draft.current, draft.released, draft.reason = outer, was_released, reason
            draft.emit("released", data={"message_id": held.message_id, "disposition": disposition})
            _derive_status(draft)
            progress = True
            break


def _park(draft: Draft, reason: str) -> None:
    draft.replace(status=Status.PARKED, park_reason=reason)
    draft.emit("parked", detail=reason)


def on_completion(draft: Draft) -> str:
    body = body_of(draft, Completion)
    state = draft.state
    if state.pending_request != body.request_id:
        draft.reason = "not the current completion request"
        return STALE
    draft.replace(pending_request=None)
    if body.error is not None:
        draft.reason = f"completion_failed:{body.error.kind}: {body.error.message}"
        draft.replace(owes_turn=True)  # unpark asks the model again
        _park(draft, draft.reason)
        return PARKED
    # By position (content, tool_calls, model, usage): one per completion (`Draft.emit` says why).
    entry = draft.append(AssistantEntry(body.content, body.tool_calls, body.model, body.usage))
    draft.turn_commit = True
    draft.replace(turns=state.turns + 1, last_total_tokens=body.usage.total_tokens, owes_turn=False,
                  pending_turn_seq=entry.seq)
    draft.emit("turn_committed", entry)
    outcomes = [run_call(draft, call, entry.seq) for call in body.tool_calls]
    draft.replace(owes_turn=bool(outcomes))
    if CallOutcome.CLOSE in outcomes:
        _close(draft, draft.close_report)
        return APPLIED
    link = state.config.parent
    if not outcomes and link is not None and link.kind == COMPACTION:
        # A compaction child that answers in text instead of calling close_thread has
        # written its summary: waiting for another input would hold the parent's
        # compaction open for good (nothing else ever talks to this child).
        said = " ".join(block.text for block in body.content if isinstance(block, TextBlock)).strip()
        _close(draft, said or None)
        return APPLIED
    if CallOutcome.REFUSED in outcomes:
        rounds = draft.state.invalid_rounds + 1
        draft.replace(invalid_rounds=rounds)
        if rounds > state.config.budgets.max_invalid_calls:
            draft.reason = f"budget max_invalid_calls exceeded ({rounds} rounds with invalid calls)"
            _park(draft, draft.reason)
            return PARKED
    else:
        draft.replace(invalid_rounds=0)
    if is_past_threshold(draft.state):
        start_compaction(draft)
    return APPLIED


def on_child_report_while_stopped(draft: Draft) -> str:
    """A stopped parent absorbs its children's reports, but forgets children that ended."""
    body = body_of(draft, ChildReport)
    child = find_child(draft.state, body)
    if child is not None and body.kind in TERMINAL_REPORTS:
        draft.replace(children=tuple(c for c in draft.state.children if c.thread_id != child.thread_id))
    draft.reason = draft.state.stop_reason
    return STOPPED


# --- handlers: operator control, stop, close, compaction -----------------------------


def on_control(draft: Draft) -> str:
    body = body_of(draft, Control)
    status = draft.state.status
    command = body.command
    if command == "delete":
        cancel_work(draft, None)
        stop_children(draft)
        draft.emit("deleted", detail=body.reason)
        draft.deleted = True
        return APPLIED
    if command == FORK:  # reads history only: a thread forks in every status
        return on_fork(draft)
    if status is Status.CLOSED:
        return rejected("thread_closed")
    if command == "stop":
        if status is Status.STOPPED:
            return rejected("already_stopped")
        _stop(draft, body.reason or "operator stop")
        return APPLIED
    if command == "resume":
        if status is not Status.STOPPED:
            return rejected("not_stopped")
        draft.replace(status=Status.IDLE, stop_reason=None)
        draft.emit("resumed")
        return APPLIED
    if command == "set_model":
        if not body.model:
            return rejected("model_missing")
        draft.replace(model=body.model)  # the next RequestCompletion carries it
        draft.emit("model_set", data={"model": body.model})
        return APPLIED
    if status is Status.STOPPED:
        return rejected("thread_stopped")
    if command == "park":
        if status is Status.PARKED:
            return rejected("already_parked")
        _park(draft, body.reason or "operator park")
        return APPLIED
    if command == "unpark":
        if status is not Status.PARKED:
            return rejected("not_parked")
        draft.replace(status=Status.IDLE, park_reason=None, invalid_rounds=0)
        draft.emit("unparked")
        return APPLIED
    if command == "cancel_call":
        return cancel_call(draft, body.call_id or "")
    if command == "compact":
        if status is Status.PARKED:
            return rejected("thread_parked")
        if draft.state.compaction is not None:
            return rejected("compaction_in_progress")
        start_compaction(draft)
        return APPLIED
    return rejected("unknown_command")


def _stop(draft: Draft, reason: str) -> None:
    cancel_work(draft, b.STOPPED_BY_OPERATOR)
    stop_children(draft)
    report_terminal(draft, "stopped", reason)
    draft.replace(status=Status.STOPPED, stop_reason=reason)
    draft.emit("stopped", detail=reason)


def _close(draft: Draft, report: str | None) -> None:
    """A child's close_thread: end everything, send the terminal report, close for good."""
    cancel_work(draft, b.CLOSED_BEFORE_RESULT)
    stop_children(draft)
    link = draft.state.config.parent
    if link is not None and link.kind == COMPACTION:
        report_terminal(draft, "summary" if report else "failed", report or b.NO_SUMMARY)
    else:
        report_terminal(draft, "closed", report)
    draft.replace(status=Status.CLOSED, owes_turn=False, deferred=())
    draft.emit("closed", detail=report)



# --- refusals and absorption ---------------------------------------------------------


def on_unexpected(draft: Draft) -> str:
    return rejected(f"unexpected_{type(draft.current.body).__name__}_while_{draft.state.status.value}")


def on_create_existing(draft: Draft) -> str:
    """A `CreateThread` for a thread that exists: a fork's names the clash (its id was chosen
    by an operator on another thread, whose fold could not know)."""
    body = body_of(draft, CreateThread)
    if body.fork is not None:
        draft.reason = (f"thread {draft.state.thread_id!r} exists: fork {body.fork.source_thread_id!r} "
                        "again under a new id")
        return rejected("thread_exists")
    return on_unexpected(draft)


def on_held(draft: Draft) -> str:
    """Parked: hold the input for the operator; it is folded on unpark, in order."""
    draft.replace(deferred=(*draft.state.deferred, draft.current))
    draft.reason = draft.state.park_reason
    return PARKED


def on_stopped(draft: Draft) -> str:
    draft.reason = draft.state.stop_reason
    return STOPPED


def on_closed(draft: Draft) -> str:
    if isinstance(draft.current.body, ToolResult | ToolEvent | TimerFired | Completion | ChildReport
                  | ApprovalRequest):
        draft.reason = "the thread is closed"
        return STALE
    return rejected("thread_closed")


# --- the table -------------------------------------------------------------------------

_LIVE: Final[dict[type[InputBody], Handler]] = {
    CreateThread: on_create_existing,
    UserMessage: on_user_message,
    Completion: on_completion,
    ToolResult: on_tool_result,
    ToolEvent: on_tool_event,
    ChildReport: on_child_report,
    ParentMessage: on_parent_message,
    TimerFired: on_timer_fired,
    ApprovalRequest: on_approval_request,
    ApprovalDecision: on_approval_decision,
    Control: on_control,
}
BODY_TYPES: Final = tuple(_LIVE)

TRANSITIONS: Final[dict[tuple[Status, type[InputBody]], Handler]] = {
    # idle, awaiting_model, awaiting_tools: every body has its own handler (its guards
    # judge staleness, deferral and interruption from the pending work, not the status).
    **{(Status.IDLE, body): handler for body, handler in _LIVE.items()},
    **{(Status.AWAITING_MODEL, body): handler for body, handler in _LIVE.items()},
    **{(Status.AWAITING_TOOLS, body): handler for body, handler in _LIVE.items()},
    # parked: everything is held for the operator except operator control.
    **{(Status.PARKED, body): on_held for body in BODY_TYPES},
    (Status.PARKED, CreateThread): on_create_existing,
    (Status.PARKED, Control): on_control,
    # stopped: a durable tombstone; children's reports still end them.
    **{(Status.STOPPED, body): on_stopped for body in BODY_TYPES},
    (Status.STOPPED, CreateThread): on_create_existing,
    (Status.STOPPED, ChildReport): on_child_report_while_stopped,
    (Status.STOPPED, Control): on_control,
    # closed: late answers are stale, anything else is refused.
    **{(Status.CLOSED, body): on_closed for body in BODY_TYPES},
    (Status.CLOSED, CreateThread): on_create_existing,
    (Status.CLOSED, Control): on_control,
}
