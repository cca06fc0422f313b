"""Provenance before folding (DESIGN 2.7): the verifiers `step` asks about every input.

Contract. A `Verifier` judges one input against the thread's state as it stands before
that input is folded, and returns a `signing.Verdict` (a provenance word and a reason).
The fold refuses `forged`, `expired`, `unbound` and `invalid` inputs, and `unsigned` ones
whose source must sign (reason `missing_signature`), each with a `rejected:<provenance>`
receipt whose `reason` is the verdict's: nothing reaches history and the partition goes on.

`KeyringVerifier(ring)`, what the processor runs when a key ring is configured, checks in
this order:

0. authority (`torpor.processors.fold.authority`): the source names a role that may produce
   this body, and that role signs here (with a key ring every role but `user` always
   does: `processor` included); an unsigned user may only touch `PUBLIC_TENANT`
   threads;
1. the signature, with `torpor.schemas.signing.verify`: the key, its window at `at` (the
   time the broker appended the input; its `created_at` where there is none), its scope
   for the source, for the tool the input answers for (the tool of the pending call,
   subscription or approval it names; `timer` for a `TimerFired`), and for the thread's
   tenant; then `expires_at` (at `at` too); then, for a root
   `CreateThread`, that the key grants the tenant, tools and scopes it asks for;
2. binding: a `ToolResult`, `ToolEvent`, `TimerFired` or `ApprovalRequest` naming a call
   this thread has pending (or a live subscription) must carry that call's dispatch
   `request_id`: otherwise `unbound`, `request_id_mismatch` (an answer to another
   dispatch, e.g. an earlier attempt's, or another thread's). A call id the thread does
   not have pending is left to the fold: `duplicate` if answered, `stale` otherwise;
3. schema: a successful `ToolResult` whose tool declares a `result_schema` must carry
   JSON text that satisfies it: otherwise `invalid`, `result_schema: <why>`.

`SourceVerifier` is development mode (no key ring): no signature is checked, every input
is `unsigned` with reason `no_keyring`, which the fold accepts from every source.

Both read only the input, the state and `at`: no clock, no I/O. `at` is the record's
broker append time (`inputs` has `message.timestamp.type=LogAppendTime`), which no writer
chooses and a replay reads back unchanged. So a replay of the `inputs` topic with the same
key ring judges every input exactly as the live processor did, even after a key rotation.
Oversized inputs never get here: the processor parks them by their encoded size.

Which verifier a processor runs, and the key it signs its own inputs with, are read from
its settings by `torpor.processors.trust` (a runtime's concern: files and settings).
"""

from __future__ import annotations

from typing import Final, Protocol

from torpor.processors.fold.authority import authority_verdict, grant_verdict
from torpor.processors.fold.builtins import TIMER_TOOL
from torpor.processors.fold.state import ThreadState
from torpor.schemas import signing
from torpor.schemas.errors import InvalidSchemaError, JsonTextError, SchemaViolation
from torpor.schemas.jsontext import compile_schema, parse_json
from torpor.schemas.keyring import KeyRing
from torpor.schemas.records import (
    INVALID,
    UNBOUND,
    UNSIGNED,
    VERIFIED,
    ApprovalRequest,
    Input,
    TextBlock,
    TimerFired,
    ToolEvent,
    ToolResult,
)
from torpor.schemas.signing import Verdict

NO_KEYRING: Final = "no_keyring"
PROCESSOR_SOURCE: Final = "processor"  # what the processor's own inputs say they come from
REQUEST_ID_MISMATCH: Final = "request_id_mismatch"
RESULT_SCHEMA: Final = "result_schema"


class Verifier(Protocol):
    """Decides an input's provenance before the fold sees it (module docstring)."""

    def verify(self, record: Input, state: ThreadState | None, at: int | None = None) -> Verdict: ...


# What development mode says of an input without a key id (nearly all of them): one frozen
# value for all, rather than one built per input.
_NO_KEYRING_UNSIGNED: Final = Verdict(UNSIGNED, NO_KEYRING, None)


class SourceVerifier:
    """Development mode: nothing is checked, every input is `unsigned`, `no_keyring`."""

    def verify(self, record: Input, state: ThreadState | None, at: int | None = None) -> Verdict:
        key_id = record.key_id
        return _NO_KEYRING_UNSIGNED if key_id is None else Verdict(UNSIGNED, NO_KEYRING, key_id)


class KeyringVerifier:
    """Authority, signatures against a key ring, then binding and result schema (module docstring)."""

    def __init__(self, ring: KeyRing) -> None:
        self._ring = ring

    def verify(self, record: Input, state: ThreadState | None, at: int | None = None) -> Verdict:
        refusal = authority_verdict(record, state, self._ring)
        if refusal is not None:
            return refusal
        bound = _bound_call(record, state)
        tool = TIMER_TOOL if isinstance(record.body, TimerFired) else bound[0] if bound else None
        tenant = state.config.capability.tenant if state is not None else None
        verdict = signing.verify(record, self._ring, tool=tool, tenant=tenant, at=at)
        refused = verdict.provenance not in (VERIFIED, UNSIGNED)
        if refused or verdict.reason == signing.MISSING_SIGNATURE:
            return verdict
        refusal = grant_verdict(record, verdict.is_verified, self._ring, at)
        if refusal is not None:
            return refusal
        if bound is not None and bound[1] != _request_id(record):
            return Verdict(UNBOUND, REQUEST_ID_MISMATCH, record.key_id)
        if state is not None and bound is not None:
            problem = _result_schema_problem(record, state, bound[0])
            if problem is not None:
                return Verdict(INVALID, f"{RESULT_SCHEMA}: {problem}", record.key_id)
        return verdict


def _request_id(record: Input) -> str | None:
    body = record.body
    if isinstance(body, ToolResult | ToolEvent | TimerFired | ApprovalRequest):
        return body.request_id
    return None


def _bound_call(record: Input, state: ThreadState | None) -> tuple[str, str] | None:
    """(tool, request id) of the pending call or live subscription the input names, if any."""
    body = record.body
    if state is None or not isinstance(body, ToolResult | ToolEvent | TimerFired | ApprovalRequest):
        return None
    if not isinstance(body, ToolEvent):
        for call in state.pending_calls:
            if call.call_id == body.call_id:
                return call.tool, call.request_id
    for subscription in state.subscriptions:
        if subscription.call_id == body.call_id:
            return subscription.tool, subscription.request_id
    return None


def _result_schema_problem(record: Input, state: ThreadState, tool: str) -> str | None:
    body = record.body
    if not isinstance(body, ToolResult) or not body.ok:
        return None  # an error result is text for the model, whatever the schema says
    spec = next((s for s in state.config.tools if s.name == tool), None)
    if spec is None or spec.result_schema is None:
        return None
    text = "".join(block.text for block in body.content if isinstance(block, TextBlock))
    try:
        value = parse_json(text)
    except JsonTextError as error:
        return str(error)  # "not JSON: ..." or "nested deeper than ... levels"
    try:
        validate = compile_schema(spec.result_schema)
    except InvalidSchemaError as error:
        return f"the tool's result_schema is not a valid JSON Schema ({error})"
    try:
        validate(value)
    except SchemaViolation as error:
        return str(error)
    return None
