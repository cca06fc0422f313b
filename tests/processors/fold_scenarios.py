"""Builders and a tiny in-memory driver for folding multi-input scenarios in tests.

`World` keeps, per thread, the fold's state, the seen message ids and the history rows,
and applies the effects the way the real shell would (the real one is `step.py`, not
used here so the fold is tested on its own): `AppendHistory` appends a row,
`RememberInput` marks an id as seen, `Loopback`, `SpawnChild` and `ForkThread` inputs are queued and
delivered in order after the input that made them (unless `auto_deliver` is off), and
everything else is recorded for assertions.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field, fields

from torpor.processors.fold.effects import (
    AppendHistory,
    DispatchTool,
    Effect,
    EmitEvent,
    EmitReceipt,
    ForkThread,
    Loopback,
    RememberInput,
    RequestCompletion,
    SpawnChild,
    Transition,
)
from torpor.processors.fold.facts import Facts
from torpor.processors.fold.state import ThreadState
from torpor.processors.fold.transitions import fold
from torpor.schemas.records import (
    VERIFIED,
    Budgets,
    Capability,
    Completion,
    CompletionError,
    Control,
    CreateThread,
    Dispatch,
    HistoryEntry,
    Input,
    InputBody,
    Receipt,
    SummaryEntry,
    TextBlock,
    ThreadConfig,
    ThreadEvent,
    ToolCall,
    ToolEvent,
    ToolResult,
    ToolSpec,
    Usage,
    UserMessage,
)

OBJECT_SCHEMA = json.dumps({"type": "object"})


def tool(name: str, parameters: str = OBJECT_SCHEMA, passive: bool = False) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=f"the {name} tool",
        parameters=parameters,
        result_schema=None,
        passive=passive,
        toolset="test",
    )


SEARCH = tool(
    "search", json.dumps({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]})
)
WATCH = tool("watch")
FETCH = tool("fetch")
SECRET = tool("secret")  # defined but outside the default capability


def config(
    tools: tuple[ToolSpec, ...] = (SEARCH, WATCH, FETCH, SECRET),
    max_invalid_calls: int = 3,
    context_window: int = 100_000,
    allow_implicit_create: bool = True,
    granted: tuple[str, ...] = ("search", "watch", "fetch"),
    max_turns: int | None = None,
    max_children: int | None = None,
    expires_at: int | None = None,
) -> ThreadConfig:
    return ThreadConfig(
        model="scripted",
        system_prompt="You are a test agent.",
        tools=tools,
        capability=Capability(tenant="acme", tools=granted, scopes=("read",), expires_at=expires_at),
        budgets=Budgets(
            max_turns=max_turns,
            max_children=max_children,
            max_tool_retries=2,
            max_invalid_calls=max_invalid_calls,
        ),
        parent=None,
        context_window=context_window,
        compaction_threshold=0.75,
        allow_implicit_create=allow_implicit_create,
    )


def call(call_id: str, name: str, arguments: object = None) -> ToolCall:
    text = json.dumps(arguments if arguments is not None else {})
    return ToolCall(call_id=call_id, name=name, arguments=text)


def usage(total: int = 100) -> Usage:
    return Usage(input_tokens=total // 2, output_tokens=total - total // 2, total_tokens=total)


def completion(
    request_id: str,
    reply: str = "",
    calls: tuple[ToolCall, ...] = (),
    total_tokens: int = 100,
    error: CompletionError | None = None,
) -> Completion:
    content = (TextBlock(reply),) if reply else ()
    return Completion(
        request_id=request_id,
        content=content,
        tool_calls=calls,
        usage=usage(total_tokens),
        model="scripted",
        error=error,
    )


def result(
    call_id: str, request_id: str, reply: str = "ok", ok: bool = True, subscription: bool = False
) -> ToolResult:
    return ToolResult(
        call_id=call_id, request_id=request_id, ok=ok, content=(TextBlock(reply),), subscription=subscription
    )


def event(
    call_id: str,
    request_id: str,
    sequence: int,
    payload: str = "tick",
    associative: bool = False,
    final: bool = False,
) -> ToolEvent:
    return ToolEvent(
        call_id=call_id,
        request_id=request_id,
        sequence=sequence,
        associative=associative,
        final=final,
        content=(TextBlock(payload),),
    )


def control(
    command: str, call_id: str | None = None, model: str | None = None, reason: str | None = None
) -> Control:
    return Control(command=command, call_id=call_id, model=model, reason=reason)


def user(message: str) -> UserMessage:
    return UserMessage(content=(TextBlock(message),))


def create(cfg: ThreadConfig | None = None, initial: str | None = "hello") -> CreateThread:
    return CreateThread(
        config=cfg or config(), inherited=(), initial=(TextBlock(initial),) if initial else ()
    )


def visible(history: list[HistoryEntry], up_to: int) -> tuple[HistoryEntry, ...]:
    """The model-visible entries among the first `up_to`: the latest summary, then what follows it."""
    rows = history[:up_to]
    summaries = [e for e in rows if isinstance(e.body, SummaryEntry)]
    if not summaries:
        return tuple(rows)
    latest = summaries[-1]
    assert isinstance(latest.body, SummaryEntry)
    start = latest.body.up_to_seq
    rest = [e for e in rows if e.seq >= start and not isinstance(e.body, SummaryEntry)]
    return (latest, *rest)


def _fields_of(state: ThreadState | None) -> tuple[object, ...]:
    return () if state is None else tuple(getattr(state, f.name) for f in fields(state))


@dataclass
class World:
    """Threads folded in memory, effects applied as a shell would. See the module docstring."""

    auto_deliver: bool = True
    default_config: ThreadConfig | None = None
    clock: int = 1_000_000
    states: dict[str, ThreadState | None] = field(default_factory=dict)
    seen: dict[str, set[str]] = field(default_factory=dict)
    histories: dict[str, list[HistoryEntry]] = field(default_factory=dict)
    receipts: list[Receipt] = field(default_factory=list)
    dispatches: list[Dispatch] = field(default_factory=list)
    requests: list[RequestCompletion] = field(default_factory=list)
    events: list[ThreadEvent] = field(default_factory=list)
    inputs: list[Input] = field(default_factory=list)
    queue: deque[Input] = field(default_factory=deque)
    transitions: list[Transition] = field(default_factory=list)
    counter: int = 0

    def envelope(
        self, thread_id: str, body: InputBody, message_id: str | None = None, source: str = "user:alice"
    ) -> Input:
        self.counter += 1
        self.clock += 1000
        return Input(
            message_id=message_id or f"m{self.counter}",
            thread_id=thread_id,
            created_at=self.clock,
            source=source,
            expires_at=None,
            key_id=None,
            signature=None,
            body=body,
        )

    def send(
        self, thread_id: str, body: InputBody, message_id: str | None = None, provenance: str = VERIFIED,
        source: str = "user:alice",
    ) -> Receipt:
        """Fold one input (then deliver the loopbacks it caused); return its receipt."""
        if isinstance(body, Completion) and message_id is None:
            message_id = body.request_id
        receipt = self.deliver(self.envelope(thread_id, body, message_id, source), provenance)
        if self.auto_deliver:
            self.drain()
        return receipt

    def deliver(self, record: Input, provenance: str = VERIFIED) -> Receipt:
        self.inputs.append(record)
        thread_id = record.thread_id
        facts = Facts(
            seen=record.message_id in self.seen.get(thread_id, set()),
            provenance=provenance,
            default_config=self.default_config,
        )
        before = self.states.get(thread_id)
        kept = _fields_of(before)
        transition = fold(before, record, facts)
        # The fold drafts on its own copy (`Draft`): the state it was given never changes.
        assert all(a is b for a, b in zip(_fields_of(before), kept, strict=True)), "fold changed its input"
        self.transitions.append(transition)
        self.states[thread_id] = transition.state
        return self.apply(thread_id, transition.effects)

    def drain(self) -> None:
        while self.queue:
            self.deliver(self.queue.popleft())

    def apply(self, thread_id: str, effects: tuple[Effect, ...]) -> Receipt:
        receipts = [e for e in effects if isinstance(e, EmitReceipt)]
        assert len(receipts) == 1 and isinstance(effects[-1], EmitReceipt), effects
        for effect in effects:
            match effect:
                case AppendHistory(entry):
                    history = self.histories.setdefault(thread_id, [])
                    assert entry.seq == len(history), (entry.seq, len(history))
                    history.append(entry)
                case RememberInput(message_id):
                    self.seen.setdefault(thread_id, set()).add(message_id)
                case Loopback(record):
                    self.queue.append(record)
                case SpawnChild():
                    inherited = visible(self.histories.get(thread_id, []), effect.up_to_seq)
                    self.queue.append(
                        Input(
                            message_id=effect.message_id,
                            thread_id=effect.child_thread_id,
                            created_at=effect.created_at,
                            source="processor",
                            expires_at=None,
                            key_id=None,
                            signature=None,
                            body=CreateThread(
                                config=effect.config, inherited=inherited, initial=effect.initial
                            ),
                        )
                    )
                case ForkThread():  # as step does: the source's entries 0..at_seq, whole
                    kept = tuple(self.histories.get(thread_id, [])[: effect.origin.at_seq + 1])
                    self.queue.append(
                        Input(
                            message_id=effect.message_id,
                            thread_id=effect.new_thread_id,
                            created_at=effect.created_at,
                            source="processor",
                            expires_at=None,
                            key_id=None,
                            signature=None,
                            body=CreateThread(config=effect.config, inherited=kept, initial=(),
                                              fork=effect.origin),
                        )
                    )
                case DispatchTool(dispatch):
                    self.dispatches.append(dispatch)
                case RequestCompletion():
                    self.requests.append(effect)
                case EmitEvent(thread_event):
                    self.events.append(thread_event)
                case EmitReceipt(receipt):
                    self.receipts.append(receipt)
        return receipts[0].receipt

    # --- lookups for assertions -----------------------------------------------------

    def state(self, thread_id: str) -> ThreadState:
        state = self.states.get(thread_id)
        assert state is not None, f"no thread {thread_id}"
        return state

    def request(self, thread_id: str) -> str:
        """The thread's pending completion request id."""
        pending = self.state(thread_id).pending_request
        assert pending is not None, f"{thread_id} awaits no completion"
        return pending

    def dispatch_for(self, thread_id: str, call_id: str, kind: str = "invoke") -> Dispatch:
        return next(
            d
            for d in reversed(self.dispatches)
            if d.thread_id == thread_id and d.call_id == call_id and d.kind == kind
        )

    def bodies(self, thread_id: str) -> list[object]:
        return [e.body for e in self.histories.get(thread_id, [])]

    def kinds(self, thread_id: str) -> list[str]:
        return [e.kind for e in self.events if e.thread_id == thread_id]

    def children(self, thread_id: str) -> list[str]:
        return [c.thread_id for c in self.state(thread_id).children]

    def reply(
        self, thread_id: str, text: str = "done", calls: tuple[ToolCall, ...] = (), total_tokens: int = 100
    ) -> Receipt:
        """Answer the thread's pending completion."""
        return self.send(thread_id, completion(self.request(thread_id), text, calls, total_tokens))
