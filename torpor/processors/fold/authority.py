"""Who may produce which input: the authority table (DESIGN 2.7, docs/security.md).

Authority comes from keys, never from what an input says about itself. An input's
`source` names a *role* (`role_of`); `AUTHORITY` says which roles may produce each body
type; with a key ring, every role but `user` must sign, and the key must be allowed for
the source (so the source string is checked against the key, never trusted alone):

    body               roles that may produce it        signs (with a key ring)
    CreateThread       user, operator: a root thread    operator always; a user when the
                       processor: a child (parent link) ring says users sign; processor
                       or a fork (`fork` set)
    UserMessage        user, operator                   as CreateThread
    Completion         processor (the model stage)      always
    ToolResult         connector (of the call's tool)   always
    ToolEvent          connector (of the call's tool)   always
    ApprovalRequest    connector (of the call's tool)   always
    ApprovalDecision   user, operator                   always, users too: it is authority
    TimerFired         timer                            always
    ChildReport        processor                        always
    ParentMessage      processor                        always
    Control            operator; processor (stopping    always
                       a child); `fork`: operator only

Capabilities are granted, not claimed. A root `CreateThread` signed by a key may ask for
a tenant, tools and scopes only within that key's `tenants`, `tools` and `scopes`; an
unsigned one (a user, where users need not sign) gets nothing but what the ring makes
public: tenant `PUBLIC_TENANT`, no scopes, and only the tools of `[policy] public_tools`
(none by default). An unsigned user may likewise only write to threads of `PUBLIC_TENANT`:
a tenant's threads take user input only under a key of that tenant. A child's
capability is its parent's (the fold copies it: `children.child_config`), and a child
`CreateThread` can only come from the processor, signed with the processor key. So can a
fork's: its capability is its source's (`forks.fork_config`), granted when the source was
created, and its history is the source's, which only the processor may write.

`authority_verdict(record, state, ring)` applies the table *before* the signature is
checked (an input that no role may produce needs no cryptography to refuse), and
`grant_verdict(record, version)` the grant rule after it. Both are pure: they read the
input, the thread's state as it was before this input, and the key ring (versioned with
validity times), so a replay judges every input as the live processor did.

Without a key ring (development mode) none of this is checked, and every receipt says
`no_keyring`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final

from torpor.processors.fold.state import ThreadState
from torpor.schemas.frozen import fast_inits
from torpor.schemas.keyring import KeyRing
from torpor.schemas.records import (
    FORGED,
    UNSIGNED,
    ApprovalDecision,
    ApprovalRequest,
    ChildReport,
    Completion,
    Control,
    CreateThread,
    Input,
    InputBody,
    ParentMessage,
    TimerFired,
    ToolEvent,
    ToolResult,
    UserMessage,
)
from torpor.schemas.signing import MISSING_SIGNATURE, Verdict

PUBLIC_TENANT: Final = "default"
"""The tenant of threads created without a key: anonymous, holding no scopes."""

# Reasons, for receipts (each names one rule of the module docstring).
UNKNOWN_SOURCE: Final = "unknown_source"
SOURCE_NOT_ALLOWED: Final = "source_not_allowed"
TENANT_NOT_GRANTED: Final = "tenant_not_granted"
TOOL_NOT_GRANTED: Final = "tool_not_granted"
SCOPE_NOT_GRANTED: Final = "scope_not_granted"


class Role(Enum):
    """Who an input's `source` says produced it; a key must agree (`KeyVersion.sources`)."""

    USER = "user"  # `user:<id>`: text and threads, through a tenant's gateway
    OPERATOR = "operator"  # `operator:<id>`: controls, approvals, threads
    CONNECTOR = "connector"  # `connector:<name>`: answers to the dispatches of its tools
    TIMER = "timer"  # `timer`: fired timers
    PROCESSOR = "processor"  # `processor`: completions and loopbacks


ALWAYS_SIGNS: Final = frozenset({Role.OPERATOR, Role.CONNECTOR, Role.TIMER, Role.PROCESSOR})
"""With a key ring, these roles sign every input; `user` signs where `Authority` or the ring says."""


@dataclass(frozen=True, slots=True)
class Authority:
    """One row of the table: who may produce a body type, and whether users must sign it."""

    roles: frozenset[Role]
    users_sign: bool = False


AUTHORITY: Final[Mapping[type[InputBody], Authority]] = {
    CreateThread: Authority(frozenset({Role.USER, Role.OPERATOR, Role.PROCESSOR})),
    UserMessage: Authority(frozenset({Role.USER, Role.OPERATOR})),
    Completion: Authority(frozenset({Role.PROCESSOR})),
    ToolResult: Authority(frozenset({Role.CONNECTOR})),
    ToolEvent: Authority(frozenset({Role.CONNECTOR})),
    ApprovalRequest: Authority(frozenset({Role.CONNECTOR})),
    ApprovalDecision: Authority(frozenset({Role.USER, Role.OPERATOR}), users_sign=True),
    TimerFired: Authority(frozenset({Role.TIMER})),
    ChildReport: Authority(frozenset({Role.PROCESSOR})),
    ParentMessage: Authority(frozenset({Role.PROCESSOR})),
    Control: Authority(frozenset({Role.OPERATOR, Role.PROCESSOR})),
}

_NAMED_ROLES: Final = {"user": Role.USER, "operator": Role.OPERATOR, "connector": Role.CONNECTOR}


FORK_COMMAND: Final = "fork"


def is_derived(body: CreateThread) -> bool:
    """Whether `body` creates a thread from another one (a child or a fork): the processor's alone."""
    return body.config.parent is not None or body.fork is not None


def role_of(source: str) -> Role | None:
    """The role `source` names: `processor`, `timer`, or `<user|operator|connector>:<name>`."""
    if source == Role.PROCESSOR.value:
        return Role.PROCESSOR
    if source == Role.TIMER.value:
        return Role.TIMER
    kind, colon, name = source.partition(":")
    return _NAMED_ROLES.get(kind) if colon and name else None


def must_sign(role: Role, body: InputBody, ring: KeyRing) -> bool:
    """True if an input of `role` carrying `body` is refused without a signature."""
    return role in ALWAYS_SIGNS or AUTHORITY[type(body)].users_sign or ring.users_must_sign


def _tenant(record: Input, state: ThreadState | None) -> str | None:
    body = record.body
    if isinstance(body, CreateThread):
        return body.config.capability.tenant
    return state.config.capability.tenant if state is not None else None


def authority_verdict(record: Input, state: ThreadState | None, ring: KeyRing) -> Verdict | None:
    """A refusal if no role may produce `record` as it stands, else None (go on to its signature).

    `forged`: the source names no role (`unknown_source`), or a role that may not produce
    this body (`source_not_allowed`; a child `CreateThread` not from the processor, or a
    root one from it, included; a `fork` control not from an operator, and a fork's creation
    not from the processor, too). `unsigned` / `missing_signature`: the role must sign
    here and there is no signature; an unsigned user writing to, or creating, a thread
    of a tenant other than `PUBLIC_TENANT` included.
    """
    role = role_of(record.source)
    if role is None:
        return Verdict(FORGED, UNKNOWN_SOURCE, record.key_id)
    body = record.body
    if role not in AUTHORITY[type(body)].roles:
        return Verdict(FORGED, SOURCE_NOT_ALLOWED, record.key_id)
    if isinstance(body, CreateThread) and is_derived(body) != (role is Role.PROCESSOR):
        return Verdict(FORGED, SOURCE_NOT_ALLOWED, record.key_id)
    if isinstance(body, Control) and body.command == FORK_COMMAND and role is not Role.OPERATOR:
        return Verdict(FORGED, SOURCE_NOT_ALLOWED, record.key_id)
    if record.signature is None:
        if must_sign(role, body, ring):
            return Verdict(UNSIGNED, MISSING_SIGNATURE, record.key_id)
        tenant = _tenant(record, state)
        if tenant is not None and tenant != PUBLIC_TENANT:
            return Verdict(UNSIGNED, MISSING_SIGNATURE, record.key_id)
    return None


def grant_verdict(record: Input, verified: bool, ring: KeyRing, at: int | None = None) -> Verdict | None:
    """A refusal if a root `CreateThread` claims more than its signer's key grants, else None.

    `verified`: its signature checked out, so the ring's version of its key at its time
    grants; else it is an accepted unsigned input, granted `PUBLIC_TENANT`, no scopes and
    the ring's public tools. `forged` with `tenant_not_granted`, `tool_not_granted` or
    `scope_not_granted` otherwise.
    """
    body = record.body
    if not isinstance(body, CreateThread) or is_derived(body):
        return None
    capability = body.config.capability
    # Looked up here, not by the caller: only a root thread's creation needs it.
    version = ring.version_at(record.key_id, record.created_at if at is None else at) \
        if verified and record.key_id is not None else None
    if version is None:
        if capability.tenant != PUBLIC_TENANT:
            return Verdict(FORGED, TENANT_NOT_GRANTED, record.key_id)
        if capability.scopes:
            return Verdict(FORGED, SCOPE_NOT_GRANTED, record.key_id)
        if not all(ring.is_public_tool(tool) for tool in capability.tools):
            return Verdict(FORGED, TOOL_NOT_GRANTED, record.key_id)
        return None
    if not version.may_sign_tenant(capability.tenant):
        return Verdict(FORGED, TENANT_NOT_GRANTED, record.key_id)
    if not all(version.may_sign_tool(tool) for tool in capability.tools):
        return Verdict(FORGED, TOOL_NOT_GRANTED, record.key_id)
    if not all(version.may_grant_scope(scope) for scope in capability.scopes):
        return Verdict(FORGED, SCOPE_NOT_GRANTED, record.key_id)
    return None

# Records are built several times per input: a faster __init__, same signature (frozen.py).
fast_inits(__name__)
