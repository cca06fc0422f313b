"""The mechanics of pending work, shared by the fold's handlers (pure; no status changes).

Ending a pending call with its one result, waking a passive wait, interrupting, holding
an input in the deferred queue, injecting an event as a synthetic call, cancelling a
thread's work, sending a child's terminal report, starting a compaction child. These
change a `Draft`'s state and effects but never assign `ThreadState.status`: the
transitions themselves are in `fold.py`.
"""

from __future__ import annotations

from typing import TypeVar

from torpor.processors.fold import builtins as b
from torpor.processors.fold.children import COMPACTION, child_config, safe_point
from torpor.processors.fold.draft import Draft, text
from torpor.processors.fold.state import (
    CallKind,
    ChildRef,
    Compaction,
    PendingCall,
    ThreadState,
    with_answered,
)
from torpor.schemas.errors import JsonTextError
from torpor.schemas.jsontext import parse_json
from torpor.schemas.records import (
    APPLIED,
    DEFERRED,
    DUPLICATE,
    STALE,
    ChildReport,
    ContentBlock,
    Control,
    EventEntry,
    HistoryEntry,
    InputBody,
    ToolResultEntry,
    rejected,
)

B = TypeVar("B", bound=InputBody)

def body_of(draft: Draft, kind: type[B]) -> B:
    body = draft.current.body
    if not isinstance(body, kind):  # pragma: no cover - a wrong TRANSITIONS row
        raise TypeError(f"{type(body).__name__} routed to the {kind.__name__} handler")
    return body


def is_deferring(state: ThreadState) -> bool:
    """Events wait while the model runs or a non-passive call is pending (passive ones end instead)."""
    return state.pending_request is not None or any(not c.passive for c in state.pending_calls)


def defer(draft: Draft) -> str:
    draft.replace(deferred=(*draft.state.deferred, draft.current))
    draft.emit("deferred", data={"message_id": draft.current.message_id,
                                 "body": type(draft.current.body).__name__})
    return DEFERRED


# --- ending pending calls ------------------------------------------------------------


def end_call(draft: Draft, call: PendingCall, body: ToolResultEntry, answered: bool, cancel: bool) -> None:
    """Give pending `call` its one result. `answered`: a real result (a copy is a duplicate,
    not stale). `cancel`: tell the connector (or the timer) to stop working on it."""
    state = draft.state
    remembered = with_answered(state.answered_calls, call.call_id) if answered else state.answered_calls
    had_approval = any(a.call_id == call.call_id for a in state.approvals)
    draft.replace(pending_calls=tuple(c for c in state.pending_calls if c.call_id != call.call_id),
                  approvals=tuple(a for a in state.approvals if a.call_id != call.call_id),
                  answered_calls=remembered,
                  owes_turn=True)
    if had_approval:
        draft.emit("approval_dismissed", data={"call_id": call.call_id})
    entry = draft.append(body)
    draft.emit("tool_result", entry)
    if cancel and call.kind is not CallKind.WAIT:
        draft.cancel(call.call_id, b.TIMER_TOOL if call.kind is CallKind.TIMER else call.tool)


def synthetic_result(call: PendingCall, content: str, origin: str, ok: bool = False) -> ToolResultEntry:
    return ToolResultEntry(call_id=call.call_id, name=call.tool, ok=ok, content=text(content), origin=origin)


def wake(draft: Draft, why: str) -> None:
    """Any event or input ends a passive wait (cancelling its timer) instead of waiting behind it."""
    for call in draft.state.pending_calls:
        if call.passive:
            result = synthetic_result(call, why, "builtin", ok=True)
            end_call(draft, call, result, answered=False, cancel=True)


def interrupt_all(draft: Draft, content: str) -> bool:
    """Cut every pending call and the pending completion short. True if anything was cut."""
    cut = draft.state.pending_request is not None
    if cut:
        draft.emit("interrupted", data={"request_id": draft.state.pending_request})
        draft.replace(pending_request=None, owes_turn=True)
    for call in draft.state.pending_calls:
        if call.passive:
            continue
        cut = True
        end_call(draft, call, synthetic_result(call, content, "interrupted"), answered=False, cancel=True)
        draft.emit("interrupted", data={"call_id": call.call_id})
    return cut


def find_call(state: ThreadState, call_id: str) -> PendingCall | None:
    return next((c for c in state.pending_calls if c.call_id == call_id), None)


def unmatched(state: ThreadState, call_id: str) -> str:
    """A result for a call that is not pending: answered before (duplicate) or never ours (stale)."""
    return DUPLICATE if call_id in state.answered_calls else STALE


def json_object(arguments: str) -> dict[str, object]:
    """`arguments` as a JSON object, or {} if they are not one (or not bounded JSON)."""
    try:
        parsed = parse_json(arguments or "{}")
    except JsonTextError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def inject(draft: Draft, kind: str, tool: str, call_id: str, arguments: str,
            content: tuple[ContentBlock, ...]) -> HistoryEntry:
    """Show something to the model as a synthetic receive_event__injected call bound to `call_id`."""
    entry = draft.append(EventEntry(call_id=draft.new_id("event-call"), kind=kind, original_tool_name=tool,
                                    original_tool_call_id=call_id, original_args=arguments, content=content))
    draft.replace(owes_turn=True)
    draft.emit("event_injected", entry)
    return entry


def find_child(state: ThreadState, body: ChildReport) -> ChildRef | None:
    return next((c for c in state.children
                 if c.thread_id == body.child_thread_id and c.spawn_call_id == body.spawn_call_id), None)


def cancel_call(draft: Draft, call_id: str) -> str:
    call = find_call(draft.state, call_id)
    if call is not None:
        end_call(draft, call, synthetic_result(call, b.CANCELLED_BY_OPERATOR, "interrupted"),
                  answered=False, cancel=True)
        return APPLIED
    subscription = next((s for s in draft.state.subscriptions if s.call_id == call_id), None)
    if subscription is None:
        return rejected("unknown_call")
    draft.replace(subscriptions=tuple(s for s in draft.state.subscriptions if s.call_id != call_id))
    draft.cancel(call_id, subscription.tool)
    draft.emit("subscription_ended", data={"call_id": call_id, "cancelled": True})
    return APPLIED


def cancel_work(draft: Draft, content: str | None) -> None:
    """Cancel every pending call (with a result `content`, if given), subscription and approval."""
    if draft.state.pending_request is not None:
        draft.replace(pending_request=None, owes_turn=True)
    for call in draft.state.pending_calls:
        if content is None:
            draft.replace(pending_calls=())
            if call.kind is not CallKind.WAIT:
                draft.cancel(call.call_id, b.TIMER_TOOL if call.kind is CallKind.TIMER else call.tool)
        else:
            end_call(draft, call, synthetic_result(call, content, "interrupted"), answered=False, cancel=True)
    for subscription in draft.state.subscriptions:
        draft.cancel(subscription.call_id, subscription.tool)
    draft.replace(pending_calls=(), subscriptions=(), approvals=(), compaction=None)


def stop_children(draft: Draft) -> None:
    for child in draft.state.children:
        draft.loopback(child.thread_id, Control(command="stop", call_id=None, model=None,
                                                reason=f"parent {draft.state.thread_id} stopped"), "stop")


def report_terminal(draft: Draft, kind: str, report: str | None) -> None:
    """Send this child's one terminal report to its parent (never a second one)."""
    link = draft.state.config.parent
    if link is None or draft.state.terminal_reported:
        return
    draft.replace(terminal_reported=True)
    report_body = ChildReport(child_thread_id=draft.state.thread_id, spawn_call_id=link.spawn_call_id,
                              kind=kind, text=report)
    draft.loopback(link.parent_thread_id, report_body, "terminal")


def is_past_threshold(state: ThreadState) -> bool:
    """Auto-compaction: the last completion used more than the configured share of the window."""
    link = state.config.parent
    if state.compaction is not None or (link is not None and link.kind == COMPACTION):
        return False
    window = state.config.context_window
    # Compared as floats, said outright: compiled (torpor.native), an int against a float is
    # compared as two floats, in Python exactly, and the two differ past 2**53 tokens (review
    # of 6616c8e). A replay must decide what the live run decided, compiled or not.
    return window > 0 and float(state.last_total_tokens) > state.config.compaction_threshold * window


def start_compaction(draft: Draft) -> None:
    state = draft.state
    up_to = safe_point(state)
    child_id = draft.stable_id("compaction", str(state.history_len))
    spawn_call_id = f"compaction-{child_id}"
    draft.spawn(child_id, child_config(state, COMPACTION, spawn_call_id), up_to, ())
    ref = ChildRef(thread_id=child_id, spawn_call_id=spawn_call_id, kind=COMPACTION, tool="compaction",
                   arguments="{}")
    compaction = Compaction(child_thread_id=child_id, up_to_seq=up_to)
    draft.replace(children=(*state.children, ref), compaction=compaction)
    draft.emit("compaction_started", data={"child_thread_id": child_id, "up_to_seq": up_to})


