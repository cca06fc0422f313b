"""The built-in tools: their specs (advertised by the model stage) and their texts.

Built-ins are folded without I/O: the fold answers them itself, except the timed sleeps,
which it dispatches to the timer connector. The texts follow the Infinity runtime's
wording (`reference/infinity-semantics.md` section 2.2) so prompts carry over.

Timers: `sleep` and `sleep_until` are dispatched with `Dispatch.tool == TIMER_TOOL`
("timer"), `call_id` the model's call, and arguments `{"due_at": <ms>, "tool": <name>}`.
The timer connector answers with a `TimerFired(call_id, request_id, due_at)` input, and
a `kind=cancel` dispatch to "timer" cancels it.
"""

from __future__ import annotations

import json
from typing import Final

from torpor.schemas.records import INJECTED_TOOL, ToolSpec

SPAWN_THREAD: Final = "spawn_thread"
REPORT_TO_PARENT: Final = "report_to_parent"
CLOSE_THREAD: Final = "close_thread"
SEND_MESSAGE_TO_CHILD: Final = "send_message_to_child"
CANCEL_SUBSCRIPTION: Final = "cancel_subscription"
SLEEP: Final = "sleep"
SLEEP_UNTIL: Final = "sleep_until"
SLEEP_UNTIL_EVENT_OR_INPUT: Final = "sleep_until_event_or_input"

TIMER_TOOL: Final = "timer"
BUILTIN_TOOLSET: Final = "builtin"


def _spec(name: str, description: str, properties: dict[str, object], required: tuple[str, ...],
          passive: bool = False) -> ToolSpec:
    schema = {"type": "object", "properties": properties, "required": list(required),
              "additionalProperties": False}
    return ToolSpec(name=name, description=description,
                    parameters=json.dumps(schema, sort_keys=True, separators=(",", ":")),
                    result_schema=None, passive=passive, toolset=BUILTIN_TOOLSET)


_STRING: Final = {"type": "string"}

BUILTIN_TOOLS: Final[tuple[ToolSpec, ...]] = (
    _spec(SPAWN_THREAD,
          "Spawn a child thread that starts with a copy of this conversation and follows "
          "the given instructions. Its reports arrive later as events.",
          {"instructions": _STRING}, ("instructions",)),
    _spec(REPORT_TO_PARENT, "Send a report to the parent thread (child threads only).",
          {"report": _STRING}, ("report",)),
    _spec(CLOSE_THREAD,
          "Close this thread for good (child threads only), optionally with a final report "
          "to the parent.", {"report": _STRING}, ()),
    _spec(SEND_MESSAGE_TO_CHILD, "Send a message to one of this thread's direct children.",
          {"thread_id": _STRING, "message": _STRING}, ("thread_id", "message")),
    _spec(CANCEL_SUBSCRIPTION, "Cancel one of this thread's active subscriptions, by its call id.",
          {"call_id": _STRING}, ("call_id",)),
    _spec(SLEEP, "Wait for a number of seconds. Any event or input ends the wait early.",
          {"seconds": {"type": "number", "minimum": 0}, "reason": _STRING}, ("seconds",), passive=True),
    _spec(SLEEP_UNTIL,
          "Wait until a time (ISO 8601, e.g. 2026-01-31T09:00:00+00:00; UTC if no offset). "
          "Any event or input ends the wait early.",
          {"time": _STRING}, ("time",), passive=True),
    _spec(SLEEP_UNTIL_EVENT_OR_INPUT, "Wait until any event or input arrives.", {}, (), passive=True),
)
BUILTIN_NAMES: Final = frozenset(spec.name for spec in BUILTIN_TOOLS)
BUILTIN_BY_NAME: Final = {spec.name: spec for spec in BUILTIN_TOOLS}


# --- texts the model reads ------------------------------------------------------------


def spawned(child_id: str) -> str:
    return (f"Child thread is successfully spawned and has ID: {child_id}. "
            "Its reports will arrive as events; you do not need to wait for them.")


def inside_child(child_id: str, parent_id: str, instructions: str) -> str:
    return (f"You are now INSIDE the thread you spawned. Your thread ID is {child_id}; "
            f"your parent thread is {parent_id}. Do not spawn this thread again. "
            "Follow these instructions, use report_to_parent to report, and close_thread "
            f"when you are done:\n{instructions}")


PARENT_CALL_ELSEWHERE: Final = "This call belongs to the parent thread; its result went there."
CONFUSED_CHILD: Final = ("Error: you are the child thread this call already spawned. Do not spawn it "
                         "again; follow your instructions instead.")
REPORT_SENT: Final = "Report sent to parent thread."
REPORT_FROM_ROOT: Final = "Error: this is the root thread; it has no parent to report to."
CLOSE_ROOT: Final = "Error: the root thread cannot be closed."
THREAD_CLOSED: Final = "Thread closed."
ALREADY_CLOSING: Final = ("Error: an earlier close_thread call of this turn already closes the thread, "
                          "with its report; this one did nothing.")
CLOSED_BEFORE_RESULT: Final = "Error: the thread was closed before this call finished."
TOO_MANY_CHILDREN: Final = "Error: this thread may not spawn more children (budget max_children)."


def message_sent(child_id: str) -> str:
    return f"Message sent to child thread {child_id}."


def not_a_child(child_id: str) -> str:
    return f"Error: '{child_id}' is not a direct child of this thread."


def subscription_cancelled(call_id: str) -> str:
    return f"Subscription '{call_id}' cancelled successfully."


def not_a_subscription(call_id: str) -> str:
    return f"Error: '{call_id}' is not an active subscription of this thread."


def slept(seconds: float) -> str:
    return f"Slept for {seconds:g} seconds."


def woke_at(time: str) -> str:
    return f"Woke up at target time {time}."


SLEEP_ENDED_BY_INPUT: Final = "Woke up early: an input arrived."
SLEEP_ENDED_BY_EVENT: Final = "Woke up early: an event arrived."
INTERRUPTED: Final = "Tool call interrupted by user"
CANCELLED_BY_OPERATOR: Final = "Tool call cancelled by an operator"
STOPPED_BY_OPERATOR: Final = "Tool call cancelled: the thread was stopped"

# --- refusals of a call (ToolResultEntry origin "error") -----------------------------

RESERVED_CALL: Final = (f"Error: you cannot directly invoke {INJECTED_TOOL}, invocations will "
                        "automatically be injected when events arrive.")


def reserved_call(name: str) -> str:
    if name == INJECTED_TOOL:
        return RESERVED_CALL
    return f"Error: '{name}' is a reserved name; it cannot be called."


def unknown_tool(name: str) -> str:
    return f"Error: tool '{name}' does not exist"


def outside_capability(name: str) -> str:
    return f"Error: this thread is not allowed to call tool '{name}'."


CAPABILITY_EXPIRED: Final = "Error: this thread's authority has expired; no tools may be called."


def invalid_arguments(name: str, why: str) -> str:
    return f"Error: invalid arguments for tool '{name}': {why}"


# --- injected events (EventEntry content) -------------------------------------------


def child_report(text: str, event_child: bool) -> str:
    if event_child:
        return f"Report from temporary child thread created to process a subscription event: {text}"
    return f"Report from child thread: {text}"


def child_closed(child_id: str, text: str | None) -> str:
    return f"Child thread with ID {child_id} has shut down" + (f". Report: {text}" if text else ".")


def event_child_closed(call_id: str, child_id: str, text: str) -> str:
    return (f"An event from your subscription {call_id} was processed by a child thread {child_id}. "
            f"The subscription remains active. Report: {text}")


def child_ended(child_id: str, kind: str, text: str | None) -> str:
    what = "failed" if kind == "failed" else "was stopped"
    return f"Child thread with ID {child_id} {what}" + (f": {text}" if text else ".")


def parent_message(text: str) -> str:
    return f"Message from parent thread: {text}"


def event_child_instructions(child_id: str, call_id: str) -> str:
    return (f"You are a temporary child thread (ID {child_id}) created to process one event from "
            f"subscription {call_id}. Handle it, then call close_thread; give a report only if "
            "the parent thread must know. The event follows.")


COMPACTION_INSTRUCTIONS: Final = (
    "Summarise the whole conversation above for your own future use: goals, decisions, facts, "
    "open work and pending calls. Then call close_thread with the summary as `report`.")
NO_SUMMARY: Final = "the compaction child closed without a summary"
