"""Typed Python twins of the Avro records in `schemas/*.avsc`: the wire contract.

Each class here is a frozen dataclass whose name is the Avro record's name (namespace
`torpor`) and whose fields are the record's fields, in the same order, with the same
types: `str` for string, `int` for int/long and timestamp-millis, `bytes` for bytes,
`bool`, `float` for double, `tuple[...]` for arrays, `X | None` for `["null", X]`, and a
union of record classes for a union of records. `tests/schemas/test_records.py` checks
every class against its schema, so the two cannot drift apart.

The `.avsc` files are the contract for clients in other languages; these classes are
how Torpor's own code holds the same records. Times are milliseconds since the epoch
(UTC). Nothing here reads a clock: a record's time is whatever its producer wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from torpor.schemas.frozen import fast_inits

# --- content blocks -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextBlock:
    """Plain text, from a user, a tool or the model."""

    text: str


@dataclass(frozen=True, slots=True)
class ImageBlock:
    """An image, inline. Models without image input see a placeholder instead."""

    media_type: str
    data: bytes


@dataclass(frozen=True, slots=True)
class ThinkingBlock:
    """Model reasoning. Kept with its provider signature so it can be sent back verbatim."""

    text: str
    signature: str | None


ContentBlock = TextBlock | ImageBlock
AssistantBlock = TextBlock | ThinkingBlock


# --- thread configuration -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool a thread may call, snapshotted into the thread when it is created.

    `parameters` and `result_schema` are JSON Schema documents as JSON text. A passive
    tool represents waiting (the sleeps): events are not deferred behind it.
    """

    name: str
    description: str
    parameters: str
    result_schema: str | None
    passive: bool
    toolset: str | None


@dataclass(frozen=True, slots=True)
class Capability:
    """The authority a thread holds, copied onto every dispatch it makes."""

    tenant: str
    tools: tuple[str, ...]
    scopes: tuple[str, ...]
    expires_at: int | None


@dataclass(frozen=True, slots=True)
class Budgets:
    """Bounds that keep one thread from running away. Each is enforced by the fold."""

    max_turns: int | None
    max_children: int | None
    max_tool_retries: int
    max_invalid_calls: int


@dataclass(frozen=True, slots=True)
class ParentLink:
    """How a child thread hangs off its parent.

    `kind` is `child` (spawned by `spawn_thread`), `event` (a temporary child that
    handles one subscription event) or `compaction` (summarises its parent's history).
    """

    parent_thread_id: str
    root_thread_id: str
    spawn_call_id: str
    kind: str
    depth: int


@dataclass(frozen=True, slots=True)
class ThreadConfig:
    """Everything a thread needs to run, fixed at creation (the model can be switched)."""

    model: str
    system_prompt: str
    tools: tuple[ToolSpec, ...]
    capability: Capability
    budgets: Budgets
    parent: ParentLink | None
    context_window: int
    compaction_threshold: float
    allow_implicit_create: bool


# --- history ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model made. `arguments` is JSON text."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage reported by the provider for one completion."""

    input_tokens: int
    output_tokens: int
    total_tokens: int


@dataclass(frozen=True, slots=True)
class UserEntry:
    """A user's message, as the model will see it."""

    content: tuple[ContentBlock, ...]
    interrupt: bool


@dataclass(frozen=True, slots=True)
class AssistantEntry:
    """One committed model turn: its text and reasoning, and every tool call it made."""

    content: tuple[AssistantBlock, ...]
    tool_calls: tuple[ToolCall, ...]
    model: str
    usage: Usage


@dataclass(frozen=True, slots=True)
class ToolResultEntry:
    """The one result of a tool call.

    `origin` says who produced it: `tool` (a connector), `builtin` (folded without
    I/O), `interrupted` (user text cut the call short), `error` (the runtime refused
    the call: unknown tool, bad arguments, reserved name, outside the capability).
    """

    call_id: str
    name: str
    ok: bool
    content: tuple[ContentBlock, ...]
    origin: str


@dataclass(frozen=True, slots=True)
class EventEntry:
    """Something that arrived for the thread outside a call's own result.

    The model sees it as a synthetic `receive_event__injected` call (id `call_id`,
    arguments `original_tool_name`, `original_tool_call_id`, `original_args`) followed
    by its result, so the original call never gets a second result. `kind` is
    `subscription_event`, `child_report`, `parent_message`, `timer` or `approval`.
    """

    call_id: str
    kind: str
    original_tool_name: str
    original_tool_call_id: str
    original_args: str
    content: tuple[ContentBlock, ...]


@dataclass(frozen=True, slots=True)
class SummaryEntry:
    """A compaction summary: the model-visible history starts here.

    It replaces entries with `seq < up_to_seq`; the stored history keeps them for audit.
    """

    text: str
    up_to_seq: int


HistoryBody = UserEntry | AssistantEntry | ToolResultEntry | EventEntry | SummaryEntry


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One entry of a thread's history, numbered from 0, made by input `input_id`."""

    seq: int
    created_at: int
    input_id: str
    body: HistoryBody


# --- input bodies -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ForkOrigin:
    """Where a forked thread comes from: the source thread, its last kept entry, the control.

    Only the processor writes one (a fork's `inherited` entries are the source's entries
    `0..at_seq`, unchanged), in answer to an operator's `fork` control on the source.
    """

    source_thread_id: str
    at_seq: int
    control_id: str
    requested_by: str


@dataclass(frozen=True, slots=True)
class CreateThread:
    """Create a thread. A child's creation carries the history it inherits; so does a fork's.

    `fork` is set on a fork's creation only (the processor's, from a `fork` control); the
    field is new in Input v2, so it defaults to None and older writers never set it.
    """

    config: ThreadConfig
    inherited: tuple[HistoryEntry, ...]
    initial: tuple[ContentBlock, ...]
    fork: ForkOrigin | None = None


@dataclass(frozen=True, slots=True)
class UserMessage:
    """Text (and images) from a person. Interrupts a pending call or completion."""

    content: tuple[ContentBlock, ...]


@dataclass(frozen=True, slots=True)
class CompletionError:
    """Why a completion failed after the model stage's retries (`kind`: the class)."""

    kind: str
    message: str
    attempts: int


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished model turn, or its failure. Its message id is its `request_id`."""

    request_id: str
    content: tuple[AssistantBlock, ...]
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    model: str
    error: CompletionError | None


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A connector's answer to dispatch `request_id` for call `call_id`.

    With `subscription=true` it also starts a subscription: `ToolEvent`s follow.
    """

    call_id: str
    request_id: str
    ok: bool
    content: tuple[ContentBlock, ...]
    subscription: bool


@dataclass(frozen=True, slots=True)
class ToolEvent:
    """One event of the subscription started by call `call_id`, numbered by `sequence`.

    `associative` events go inline into the thread; others are handled by a temporary
    child. `final` ends the subscription.
    """

    call_id: str
    request_id: str
    sequence: int
    associative: bool
    final: bool
    content: tuple[ContentBlock, ...]


@dataclass(frozen=True, slots=True)
class ChildReport:
    """A child thread reporting to its parent.

    `kind` is `report` (the child goes on), or a terminal one: `closed`, `failed`,
    `stopped`, or `summary` (a compaction child's result). Each child sends exactly one
    terminal report.
    """

    child_thread_id: str
    spawn_call_id: str
    kind: str
    text: str | None


@dataclass(frozen=True, slots=True)
class ParentMessage:
    """A parent's message to its direct child (`send_message_to_child`)."""

    parent_thread_id: str
    spawn_call_id: str
    text: str


@dataclass(frozen=True, slots=True)
class TimerFired:
    """The timer connector's wake-up for a `sleep` or `sleep_until` call."""

    call_id: str
    request_id: str
    due_at: int


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A tool asks a person to decide. The thread keeps it pending until decided or expired."""

    approval_id: str
    call_id: str
    request_id: str
    prompt: str
    choices: tuple[str, ...]
    default_choice: str | None
    expires_at: int | None


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """A person's decision on approval `approval_id`."""

    approval_id: str
    choice: str
    decided_by: str


@dataclass(frozen=True, slots=True)
class Control:
    """An operator's command.

    `command` is one of `stop`, `resume`, `park`, `unpark`, `cancel_call` (needs
    `call_id`), `compact`, `delete`, `set_model` (needs `model`), `fork` (needs
    `new_thread_id` and `at_seq`; `model`, if given, is the fork's). The two fork fields are
    new in Input v2: they default to None, as every command but `fork` leaves them.
    """

    command: str
    call_id: str | None
    model: str | None
    reason: str | None
    new_thread_id: str | None = None
    at_seq: int | None = None


InputBody = (
    CreateThread
    | UserMessage
    | Completion
    | ToolResult
    | ToolEvent
    | ChildReport
    | ParentMessage
    | TimerFired
    | ApprovalRequest
    | ApprovalDecision
    | Control
)


@dataclass(frozen=True, slots=True)
class Input:
    """The envelope of every record on the `inputs` topic, keyed by `thread_id`.

    `message_id` is stable and chosen by the producer: it is the dedup key.
    `created_at` is the fold's notion of now. `source` is `user:<id>`,
    `connector:<name>`, `processor`, `operator:<id>` or `timer`. `key_id` and
    `signature` sign the envelope (required for connector, timer and operator sources).
    """

    message_id: str
    thread_id: str
    created_at: int
    source: str
    expires_at: int | None
    key_id: str | None
    signature: bytes | None
    body: InputBody


# --- outputs ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A record on the `outbox`: work for a connector, durable before it is visible.

    `request_id` is the idempotency key of the effect, stable across retries. `kind` is
    `invoke`, `cancel`, `close_thread` or `approval_decision` (then `arguments` holds
    the decision as JSON).
    """

    request_id: str
    thread_id: str
    call_id: str
    tool: str
    arguments: str
    capability: Capability
    attempt: int
    created_at: int
    deadline: int | None
    kind: str


@dataclass(frozen=True, slots=True)
class ThreadEvent:
    """A record on the `events` topic, for observers.

    `kind` names what happened (past tense: `thread_created`, `turn_committed`,
    `tool_dispatched`, `child_spawned`, ...; `delta` for live model output).
    `ephemeral` events (live deltas) are not part of the committed history. `entry` is
    the history entry the event is about, when there is one; `data` is JSON detail.
    """

    event_id: str
    thread_id: str
    created_at: int
    kind: str
    ephemeral: bool
    seq: int | None
    entry: HistoryEntry | None
    text: str | None
    data: str | None


@dataclass(frozen=True, slots=True)
class Receipt:
    """Exactly one per input: what the runtime did with it (the resume contract).

    `disposition` is `applied`, `duplicate`, `deferred`, `stale`, `rejected:<reason>`,
    `stopped` or `parked`. `history_before`/`history_after` are the thread's hash-chain
    heads (hex). `input_partition`/`input_offset` are filled in by the processor.
    """

    receipt_id: str
    thread_id: str
    input_id: str
    input_partition: int | None
    input_offset: int | None
    created_at: int
    disposition: str
    reason: str | None
    history_before: str
    history_after: str
    thread_version: int
    tool_request_ids: tuple[str, ...]
    authority_snapshot: Capability | None
    turn_commit: bool
    provenance: str
    retry_count: int
    runtime_build: str


# Dispositions that are not `rejected:<reason>`.
APPLIED: Final = "applied"
DUPLICATE: Final = "duplicate"
DEFERRED: Final = "deferred"
STALE: Final = "stale"
STOPPED: Final = "stopped"
PARKED: Final = "parked"


def rejected(reason: str) -> str:
    """The disposition for an input refused for `reason` (a short snake_case word)."""
    return f"rejected:{reason}"


# Provenance verdicts, decided by the shell before the fold runs.
VERIFIED: Final = "verified"
UNSIGNED: Final = "unsigned"
FORGED: Final = "forged"
EXPIRED: Final = "expired"
UNBOUND: Final = "unbound"
INVALID: Final = "invalid"  # signed well enough, but fails its tool's declared result schema
UNCHECKED: Final = "unchecked"  # refused at the door (ids, record key, partition) before any verdict

RESERVED_SUFFIX: Final = "__injected"
INJECTED_TOOL: Final = "receive_event__injected"

# Records are built several times per input: a faster __init__, same signature (frozen.py).
fast_inits(__name__)
