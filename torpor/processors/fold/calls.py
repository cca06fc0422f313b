"""The calls of one committed turn: refusal checks and the built-in tools (pure).

`run_call` handles one `ToolCall` of a just-committed `AssistantEntry`: it refuses
invalid calls with an error result, answers the built-ins that need no I/O at once,
and turns real tool calls and timed sleeps into pending calls plus dispatches. It never
assigns a status: a valid `close_thread` is reported back as `CallOutcome.CLOSE` and
`fold.py` closes the thread.

Arguments are read and validated by `torpor.schemas.jsontext` (bounded depth, RE2
regexes, metered validation, validators memoised per schema text): whatever the model or
a `CreateThread` wrote, a bad call becomes a refusal the model reads, never an exception
that parks the thread, and the verdict is the same on a replay.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import Enum
from typing import Final

from torpor.processors.fold import builtins as b
from torpor.processors.fold.children import CHILD, child_config, is_root
from torpor.processors.fold.draft import Draft, json_text, text
from torpor.processors.fold.state import CallKind, ChildRef, PendingCall, with_answered
from torpor.schemas.avrowriter import LONG_MAX
from torpor.schemas.errors import InvalidSchemaError, JsonTextError, SchemaViolation
from torpor.schemas.jsontext import compile_schema, parse_json
from torpor.schemas.records import (
    INJECTED_TOOL,
    RESERVED_SUFFIX,
    ChildReport,
    ParentMessage,
    ToolCall,
    ToolResultEntry,
    ToolSpec,
)


class CallOutcome(Enum):
    ANSWERED = "answered"  # a result is already in history
    PENDING = "pending"  # waiting for a connector, a timer or any input
    REFUSED = "refused"  # an error result was injected; counts against max_invalid_calls
    CLOSE = "close"  # a valid close_thread: the fold closes the thread after the turn


def is_reserved(name: str) -> bool:
    """The model may never call the synthetic event tool or any `__injected` name."""
    return name == INJECTED_TOOL or name.endswith(RESERVED_SUFFIX)


def find_spec(draft: Draft, name: str) -> ToolSpec | None:
    if name in b.BUILTIN_BY_NAME:
        return b.BUILTIN_BY_NAME[name]
    return next((spec for spec in draft.state.config.tools if spec.name == name), None)


def refusal(draft: Draft, call: ToolCall) -> str | None:
    """Why `call` must not run (the error text the model gets), or None if it may."""
    if is_reserved(call.name):
        return b.reserved_call(call.name)
    spec = find_spec(draft, call.name)
    if spec is None:
        return b.unknown_tool(call.name)
    capability = draft.state.config.capability
    if spec.name not in b.BUILTIN_NAMES:
        if spec.name not in capability.tools:
            return b.outside_capability(call.name)
        if capability.expires_at is not None and draft.now >= capability.expires_at:
            return b.CAPABILITY_EXPIRED
    try:
        compile_schema(spec.parameters)(parse_json(call.arguments or "{}"))
    except (JsonTextError, SchemaViolation) as error:
        return b.invalid_arguments(call.name, str(error))
    except InvalidSchemaError as error:  # registered before schemas were checked at CreateThread
        return b.invalid_arguments(call.name, f"the tool's parameters schema is invalid: {error}")
    return None


def answer(draft: Draft, call: ToolCall, content: str, ok: bool = True, origin: str = "builtin") -> None:
    entry = draft.append(ToolResultEntry(call_id=call.call_id, name=call.name, ok=ok,
                                         content=text(content), origin=origin))
    draft.replace(answered_calls=with_answered(draft.state.answered_calls, call.call_id))
    draft.emit("tool_result", entry)


def _arguments(call: ToolCall) -> dict[str, object]:
    try:
        parsed = parse_json(call.arguments or "{}")
    except JsonTextError:  # `refusal` already answered such a call; never reached
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _pend(draft: Draft, call: ToolCall, kind: CallKind, request_id: str, passive: bool) -> None:
    pending = PendingCall(call_id=call.call_id, tool=call.name, arguments=call.arguments,
                          passive=passive, kind=kind, request_id=request_id, dispatched_at=draft.now,
                          attempts=draft.facts.attempt)
    draft.replace(pending_calls=(*draft.state.pending_calls, pending))


def run_call(draft: Draft, call: ToolCall, turn_seq: int) -> CallOutcome:
    """Handle one call of the turn committed at `turn_seq`. See the module docstring."""
    why = refusal(draft, call)
    if why is not None:
        answer(draft, call, why, ok=False, origin="error")
        return CallOutcome.REFUSED
    if call.name in b.BUILTIN_NAMES:
        return _run_builtin(draft, call, turn_seq)
    spec = find_spec(draft, call.name)
    request_id = draft.stable_id("dispatch", call.call_id)
    _pend(draft, call, CallKind.TOOL, request_id, passive=spec.passive if spec else False)
    dispatch = draft.dispatch(call.call_id, call.name, call.arguments, "invoke", request_id)
    draft.emit("tool_dispatched", data={"call_id": call.call_id, "tool": call.name,
                                        "request_id": dispatch.request_id})
    return CallOutcome.PENDING


def _run_builtin(draft: Draft, call: ToolCall, turn_seq: int) -> CallOutcome:
    args = _arguments(call)
    state = draft.state
    link = state.config.parent
    if call.name == b.SPAWN_THREAD:
        return _spawn(draft, call, str(args["instructions"]), turn_seq)
    if call.name == b.REPORT_TO_PARENT:
        if link is None:
            answer(draft, call, b.REPORT_FROM_ROOT, ok=False)
            return CallOutcome.ANSWERED
        draft.loopback(link.parent_thread_id, ChildReport(child_thread_id=state.thread_id,
                                                          spawn_call_id=link.spawn_call_id, kind="report",
                                                          text=str(args["report"])), "report", call.call_id)
        answer(draft, call, b.REPORT_SENT)
        return CallOutcome.ANSWERED
    if call.name == b.CLOSE_THREAD:
        if is_root(state):
            answer(draft, call, b.CLOSE_ROOT, ok=False)
            return CallOutcome.ANSWERED
        if draft.closing:  # only the first close_thread of a turn closes, with its report
            answer(draft, call, b.ALREADY_CLOSING, ok=False)
            return CallOutcome.ANSWERED
        draft.closing = True
        answer(draft, call, b.THREAD_CLOSED)
        report = args.get("report")
        draft.close_report = report if isinstance(report, str) and report else None
        return CallOutcome.CLOSE
    if call.name == b.SEND_MESSAGE_TO_CHILD:
        child_id = str(args["thread_id"])
        child = next((c for c in state.children if c.thread_id == child_id and c.kind == CHILD), None)
        if child is None:
            answer(draft, call, b.not_a_child(child_id), ok=False)
            return CallOutcome.ANSWERED
        message = ParentMessage(parent_thread_id=state.thread_id, spawn_call_id=child.spawn_call_id,
                                text=str(args["message"]))
        draft.loopback(child_id, message, "message", call.call_id)
        answer(draft, call, b.message_sent(child_id))
        return CallOutcome.ANSWERED
    if call.name == b.CANCEL_SUBSCRIPTION:
        target = str(args["call_id"])
        subscription = next((s for s in state.subscriptions if s.call_id == target), None)
        if subscription is None:
            answer(draft, call, b.not_a_subscription(target), ok=False)
            return CallOutcome.ANSWERED
        draft.replace(subscriptions=tuple(s for s in state.subscriptions if s.call_id != target))
        draft.cancel(target, subscription.tool)
        answer(draft, call, b.subscription_cancelled(target))
        return CallOutcome.ANSWERED
    if call.name == b.SLEEP_UNTIL_EVENT_OR_INPUT:
        _pend(draft, call, CallKind.WAIT, "", passive=True)
        return CallOutcome.PENDING
    return _sleep(draft, call, args)


def _spawn(draft: Draft, call: ToolCall, instructions: str, turn_seq: int) -> CallOutcome:
    state = draft.state
    link = state.config.parent
    if link is not None and (call.call_id == link.spawn_call_id or (
            link.kind == CHILD and state.spawn_arguments is not None
            and _same_arguments(state.spawn_arguments, call.arguments))):
        answer(draft, call, b.CONFUSED_CHILD, ok=False)
        return CallOutcome.ANSWERED
    budget = state.config.budgets.max_children
    live = sum(1 for c in state.children if c.kind == CHILD)  # temporary children do not count
    if budget is not None and live >= budget:
        answer(draft, call, b.TOO_MANY_CHILDREN, ok=False)
        return CallOutcome.ANSWERED
    child_id = draft.stable_id("child", call.call_id)
    # The child inherits everything up to and including the turn that spawned it.
    draft.spawn(child_id, child_config(state, CHILD, call.call_id), turn_seq + 1, text(instructions))
    ref = ChildRef(thread_id=child_id, spawn_call_id=call.call_id, kind=CHILD, tool=call.name,
                   arguments=call.arguments)
    draft.replace(children=(*state.children, ref))
    draft.emit("child_spawned", data={"child_thread_id": child_id, "spawn_call_id": call.call_id})
    answer(draft, call, b.spawned(child_id))
    return CallOutcome.ANSWERED


def _same_arguments(left: str, right: str) -> bool:
    try:
        return bool(parse_json(left) == parse_json(right))
    except JsonTextError:
        return left == right


def _sleep(draft: Draft, call: ToolCall, args: dict[str, object]) -> CallOutcome:
    if call.name == b.SLEEP:
        seconds = args["seconds"]
        assert isinstance(seconds, int | float)  # the schema guarantees a number
        later = _due_after(draft.now, seconds)
        if later is None:
            why = b.invalid_arguments(call.name, f"seconds is too large (at most {MAX_SLEEP_SECONDS})")
            answer(draft, call, why, ok=False, origin="error")
            return CallOutcome.REFUSED
        due_at = later
    else:
        due = parse_time(str(args["time"]))
        if due is None:
            why = b.invalid_arguments(call.name, "time is not ISO 8601")
            answer(draft, call, why, ok=False, origin="error")
            return CallOutcome.REFUSED
        due_at = due
    request_id = draft.stable_id("dispatch", call.call_id)
    _pend(draft, call, CallKind.TIMER, request_id, passive=True)
    draft.dispatch(call.call_id, b.TIMER_TOOL, json_text({"due_at": due_at, "tool": call.name}), "invoke",
                   request_id, deadline=due_at)
    draft.emit("tool_dispatched", data={"call_id": call.call_id, "tool": b.TIMER_TOOL, "due_at": due_at})
    return CallOutcome.PENDING


MAX_SLEEP_SECONDS: Final = 10**15
"""About 31.7 million years: the most a `sleep` may ask for. A timer's due time travels as an
Avro long (ms): a model's `{"seconds": 1e300}` made a dispatch that could not be encoded
(outside the step's per-input protection: `outputs.step_records`), and a `seconds` of 400
digits parked the thread (float overflow). Now such a call is refused like a bad argument."""


def _due_after(now: int, seconds: int | float) -> int | None:
    """`now` plus `seconds` in ms, as the fold always computed it, or None past `MAX_SLEEP_SECONDS`."""
    if not 0 <= seconds <= MAX_SLEEP_SECONDS:  # an int too large for a float, inf, nan: all refused
        return None
    due = now + round(float(seconds) * 1000)
    return due if due <= LONG_MAX else None


def parse_time(value: str) -> int | None:
    """ISO 8601 time as epoch ms (UTC if it has no offset), or None if it does not parse."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


SLEEP_TOOLS: Final = frozenset({b.SLEEP, b.SLEEP_UNTIL})
