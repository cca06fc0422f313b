"""The fold's handlers that never change a thread's status (pure).

Each is a row of `fold.TRANSITIONS`: guards first (stale, duplicate, wrong sender,
deferral), then the new state through the `Draft`, then effects. The disposition is
returned; `fold.py` settles the thread (status, released inputs, the next completion)
and writes the one receipt.
"""

from __future__ import annotations

import bisect
import dataclasses

from torpor.processors.fold import builtins as b
from torpor.processors.fold.children import (
    CHILD,
    COMPACTION,
    EVENT,
    TERMINAL_REPORTS,
    child_config,
    safe_point,
)
from torpor.processors.fold.draft import Draft, json_text, text
from torpor.processors.fold.pending import (
    body_of,
    defer,
    end_call,
    find_call,
    find_child,
    inject,
    interrupt_all,
    is_deferring,
    json_object,
    synthetic_result,
    unmatched,
    wake,
)
from torpor.processors.fold.state import (
    CallKind,
    ChildRef,
    PendingApproval,
    Subscription,
)
from torpor.schemas.records import (
    APPLIED,
    DUPLICATE,
    STALE,
    ApprovalDecision,
    ApprovalRequest,
    AssistantEntry,
    ChildReport,
    CreateThread,
    EventEntry,
    ParentMessage,
    SummaryEntry,
    TimerFired,
    ToolEvent,
    ToolResult,
    ToolResultEntry,
    UserEntry,
    UserMessage,
    rejected,
)

# --- handlers: threads and turns -----------------------------------------------------


def on_create_thread(draft: Draft) -> str:
    body = body_of(draft, CreateThread)
    link = body.config.parent
    answered: set[str] = set()
    calls: dict[str, tuple[str, str]] = {}
    seqs = sorted(e.seq for e in body.inherited)  # one sort: each summary is renumbered by bisection
    for old in body.inherited:
        entry = old.body
        if isinstance(entry, SummaryEntry):  # renumber into the child's own seq space
            kept = bisect.bisect_left(seqs, min(entry.up_to_seq, old.seq))
            entry = dataclasses.replace(entry, up_to_seq=kept)
        if isinstance(entry, AssistantEntry):
            calls.update({c.call_id: (c.name, c.arguments) for c in entry.tool_calls})
        if isinstance(entry, ToolResultEntry):
            answered.add(entry.call_id)
        draft.append(entry, input_id=old.input_id)
    open_calls = [call_id for call_id in calls if call_id not in answered]
    if link is not None:
        draft.replace(spawn_arguments=calls.get(link.spawn_call_id, ("", None))[1])
    instructions = "".join(block.text for block in body.initial if hasattr(block, "text"))
    for call_id in open_calls:  # the parent's other calls of the spawning turn are answered there
        name = calls[call_id][0]
        if link is not None and link.kind == CHILD and call_id == link.spawn_call_id:
            content = b.inside_child(draft.state.thread_id, link.parent_thread_id, instructions)
        else:
            content = b.PARENT_CALL_ELSEWHERE
        draft.append(ToolResultEntry(call_id=call_id, name=name, ok=True, content=text(content),
                                     origin="builtin"))
    if link is not None and link.kind == EVENT:
        name, arguments = calls.get(link.spawn_call_id, ("unknown", "{}"))
        preface = text(b.event_child_instructions(draft.state.thread_id, link.spawn_call_id))
        event_content = (*preface, *body.initial)
        draft.append(EventEntry(call_id=draft.new_id("event-call"), kind="subscription_event",
                                original_tool_name=name, original_tool_call_id=link.spawn_call_id,
                                original_args=arguments, content=event_content))
    elif link is not None and link.kind == COMPACTION:
        draft.append(UserEntry(content=text(b.COMPACTION_INSTRUCTIONS), interrupt=False))
    elif link is None and body.initial:
        draft.append(UserEntry(content=body.initial, interrupt=False))
    draft.replace(owes_turn=draft.state.history_len > 0 and (link is not None or bool(body.initial)))
    return APPLIED


def on_user_message(draft: Draft) -> str:
    body = body_of(draft, UserMessage)
    wake(draft, b.SLEEP_ENDED_BY_INPUT)
    interrupted = interrupt_all(draft, b.INTERRUPTED)
    entry = draft.append(UserEntry(content=body.content, interrupt=interrupted))
    draft.replace(owes_turn=True)
    draft.emit("input_accepted", entry)
    return APPLIED


def on_tool_result(draft: Draft) -> str:
    body = body_of(draft, ToolResult)
    call = find_call(draft.state, body.call_id)
    # Only a connector's call takes a connector's result: a sleep is the timer's to end,
    # a wait any input's (its request id is empty, so it must never bind).
    if call is None or call.kind is not CallKind.TOOL or call.request_id != body.request_id:
        draft.reason = "no pending call with this id and request"
        return unmatched(draft.state, body.call_id) if call is None else STALE
    end_call(draft, call, ToolResultEntry(call_id=call.call_id, name=call.tool, ok=body.ok,
                                           content=body.content, origin="tool"), answered=True, cancel=False)
    if body.subscription and body.ok:
        subscription = Subscription(call_id=call.call_id, tool=call.tool, arguments=call.arguments,
                                    request_id=body.request_id, last_sequence=-1)
        draft.replace(subscriptions=(*draft.state.subscriptions, subscription))
        draft.emit("subscription_started", data={"call_id": call.call_id, "tool": call.tool})
    return APPLIED


def on_timer_fired(draft: Draft) -> str:
    body = body_of(draft, TimerFired)
    call = find_call(draft.state, body.call_id)
    if call is None or call.kind is not CallKind.TIMER or call.request_id != body.request_id:
        draft.reason = "no pending timer with this id and request"
        return unmatched(draft.state, body.call_id) if call is None else STALE
    args = json_object(call.arguments)
    if call.tool == b.SLEEP:
        content = b.slept(float(str(args.get("seconds", 0))))
    else:
        content = b.woke_at(str(args.get("time", body.due_at)))
    end_call(draft, call, synthetic_result(call, content, "builtin", ok=True), answered=True, cancel=False)
    return APPLIED


# --- handlers: events, children, parents ---------------------------------------------


def on_tool_event(draft: Draft) -> str:
    body = body_of(draft, ToolEvent)
    subscription = next((s for s in draft.state.subscriptions if s.call_id == body.call_id), None)
    if subscription is None:
        draft.reason = "no active subscription with this call id"
        return STALE
    # A repeated or older sequence is a duplicate: older than the last one applied, or (on
    # arrival) than one already waiting in the deferred queue. A released event is judged
    # against what was applied only, so a copy held while parked is still caught.
    latest = subscription.last_sequence
    if not draft.released:
        latest = max((latest, *(held.body.sequence for held in draft.state.deferred
                                if isinstance(held.body, ToolEvent) and held.body.call_id == body.call_id)))
    if body.sequence <= latest:
        draft.reason = f"sequence {body.sequence} already seen"
        return DUPLICATE
    if not draft.released and is_deferring(draft.state):
        return defer(draft)
    advanced = dataclasses.replace(subscription, last_sequence=body.sequence)
    draft.replace(subscriptions=tuple(advanced if s.call_id == body.call_id else s
                                      for s in draft.state.subscriptions))
    if body.associative:
        wake(draft, b.SLEEP_ENDED_BY_EVENT)
        inject(draft, "subscription_event", subscription.tool, subscription.call_id, subscription.arguments,
                body.content)
    else:
        # A temporary child handles it, from a safe point: the parent may keep waiting.
        child_id = draft.stable_id("event-child", body.call_id, str(body.sequence))
        draft.spawn(child_id, child_config(draft.state, EVENT, body.call_id), safe_point(draft.state),
                    body.content)
        ref = ChildRef(thread_id=child_id, spawn_call_id=body.call_id, kind=EVENT, tool=subscription.tool,
                       arguments=subscription.arguments)
        draft.replace(children=(*draft.state.children, ref))
        draft.emit("child_spawned", data={"child_thread_id": child_id, "spawn_call_id": body.call_id,
                                          "kind": EVENT, "sequence": body.sequence})
    if body.final:
        draft.replace(subscriptions=tuple(s for s in draft.state.subscriptions if s.call_id != body.call_id))
        draft.emit("subscription_ended", data={"call_id": body.call_id, "sequence": body.sequence})
    return APPLIED


def on_child_report(draft: Draft) -> str:
    body = body_of(draft, ChildReport)
    child = find_child(draft.state, body)
    if child is None:
        draft.reason = "no live child with this id and spawn call"
        return STALE
    if child.kind == COMPACTION:
        return _on_compaction_report(draft, child, body)
    if not draft.released and is_deferring(draft.state):
        return defer(draft)
    if body.kind in TERMINAL_REPORTS:
        draft.replace(children=tuple(c for c in draft.state.children if c.thread_id != child.thread_id))
    content = _report_text(child, body)
    if content is None:  # an event child closing silently: nothing for the model
        draft.emit("child_reported", data={"child_thread_id": child.thread_id, "kind": body.kind})
        return APPLIED
    wake(draft, b.SLEEP_ENDED_BY_EVENT)
    entry = inject(draft, "child_report", child.tool, child.spawn_call_id, child.arguments, text(content))
    draft.emit("child_reported", entry, data={"child_thread_id": child.thread_id, "kind": body.kind})
    return APPLIED


def _report_text(child: ChildRef, body: ChildReport) -> str | None:
    if body.kind == "report":
        return b.child_report(body.text or "", event_child=child.kind == EVENT)
    if body.kind == "closed":
        if child.kind == EVENT:
            if not body.text:
                return None
            return b.event_child_closed(child.spawn_call_id, child.thread_id, body.text)
        return b.child_closed(child.thread_id, body.text)
    return b.child_ended(child.thread_id, body.kind, body.text)


def _on_compaction_report(draft: Draft, child: ChildRef, body: ChildReport) -> str:
    """A summary is applied at once (never deferred: it is not for the model to answer)."""
    compaction = draft.state.compaction
    draft.replace(children=tuple(c for c in draft.state.children if c.thread_id != child.thread_id),
                  compaction=None)
    if body.kind != "summary" or compaction is None or compaction.child_thread_id != child.thread_id:
        draft.emit("compaction_failed", detail=body.text, data={"child_thread_id": child.thread_id})
        return APPLIED
    entry = draft.append(SummaryEntry(text=body.text or "", up_to_seq=compaction.up_to_seq))
    draft.replace(last_total_tokens=0)  # so the threshold does not fire again at once
    draft.emit("compaction_applied", entry, data={"up_to_seq": compaction.up_to_seq})
    return APPLIED


def on_parent_message(draft: Draft) -> str:
    body = body_of(draft, ParentMessage)
    link = draft.state.config.parent
    sender = (body.parent_thread_id, body.spawn_call_id)
    if link is None or (link.parent_thread_id, link.spawn_call_id) != sender:
        return rejected("not_from_parent")
    if not draft.released and is_deferring(draft.state):
        return defer(draft)
    wake(draft, b.SLEEP_ENDED_BY_EVENT)
    inject(draft, "parent_message", b.SPAWN_THREAD, link.spawn_call_id, draft.state.spawn_arguments or "{}",
            text(b.parent_message(body.text)))
    return APPLIED


# --- handlers: approvals -------------------------------------------------------------


def on_approval_request(draft: Draft) -> str:
    body = body_of(draft, ApprovalRequest)
    call = find_call(draft.state, body.call_id)
    if call is None or call.kind is not CallKind.TOOL or call.request_id != body.request_id:
        draft.reason = "not bound to a pending call of this thread"
        return STALE
    if any(a.approval_id == body.approval_id for a in draft.state.approvals):
        return DUPLICATE
    approval = PendingApproval(approval_id=body.approval_id, call_id=body.call_id, request_id=body.request_id,
                               tool=call.tool, choices=body.choices, expires_at=body.expires_at)
    draft.replace(approvals=(*draft.state.approvals, approval))
    draft.emit("approval_requested", detail=body.prompt,
               data={"approval_id": body.approval_id, "call_id": body.call_id, "choices": list(body.choices),
                     "default_choice": body.default_choice, "expires_at": body.expires_at})
    return APPLIED


def on_approval_decision(draft: Draft) -> str:
    body = body_of(draft, ApprovalDecision)
    approval = next((a for a in draft.state.approvals if a.approval_id == body.approval_id), None)
    if approval is None:
        return rejected("unknown_approval")
    if approval.expires_at is not None and draft.now >= approval.expires_at:
        return rejected("approval_expired")
    if body.choice not in approval.choices:
        return rejected("invalid_choice")
    draft.replace(approvals=tuple(a for a in draft.state.approvals if a.approval_id != body.approval_id))
    # The decider is the input's source, which a key ring checks against its key; the
    # body's `decided_by` is only what the client says, so it is not what the tool is told.
    decision = {"approval_id": body.approval_id, "choice": body.choice, "decided_by": draft.current.source}
    draft.dispatch(approval.call_id, approval.tool, json_text(decision), "approval_decision",
                   draft.stable_id("approval", body.approval_id))
    draft.emit("approval_decided", data=decision)
    return APPLIED
