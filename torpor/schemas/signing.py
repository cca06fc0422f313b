"""The signing rule for `Input` envelopes: what is signed, how, and how it is judged.

Any language can implement it from this docstring, the `.avsc` files and the test
vector in `tests/schemas/test_signing.py`.

The signed bytes, version 1
---------------------------
Ed25519 (RFC 8032, pure, no pre-hash) over ``signing_bytes(input)``::

    signing_bytes(input) =
        b"torpor-input-v1\\x00"                      16 bytes: a domain tag, so these bytes
                                                     can never be mistaken for another message
        || str(message_id) || str(thread_id) || str(source)
        || i64be(created_at)                         8 bytes, two's complement (an Avro long)
        || expires                                   0x00 if expires_at is null, else
                                                     0x01 || i64be(expires_at)
        || str(key_id)                               the key id being signed with
        || str(body_name)                            the Avro full name of the body's record,
                                                     e.g. "torpor.ToolResult"
        || blob(body_bytes)                          the schemaless Avro binary encoding of
                                                     the body record under its own schema

    str(s)  = u32be(len(utf8(s))) || utf8(s)
    blob(b) = u32be(len(b)) || b

The signature (64 bytes) goes in the envelope's `signature` field, which is the one
field not covered. Every field is length-prefixed or fixed-width, so no two different
envelopes give the same bytes. The body's union branch is covered by its record name,
not by its position in the `Input.body` union, so adding a body type to the union does
not change what older inputs signed. `key_id` is covered, so a signature cannot be moved
onto another entry of the key ring that happens to hold the same public key with a wider
scope. `body_bytes` is `torpor.schemas.codec.canonical_bytes(body)`: for a record
decoded from the topic it is the encoding under *this build's* schema of the body, so a
schema change that adds a field to a body changes those bytes for old records (see the
note on evolution below).

Judging a signature
-------------------
`verify(input, keyring, tool=..., tenant=..., policy=..., at=...)` returns a `Verdict`:
one of the provenance words of `records.py` and a reason for the receipt. It reads no
clock: every time it compares is `at`, which the processor passes as the time the broker
appended the input (`inputs` has `message.timestamp.type=LogAppendTime`; a replay reads
the same time back), so replaying the `inputs` topic judges each input exactly as it was
judged live (DESIGN 2.1, section 3), and a signer cannot choose the time its key is
judged at by back-dating `created_at`. Without `at` (local mode, older topics) it is
the input's own `created_at`. The order:

1. No signature: `unsigned`, reason `missing_signature` if `policy` says the source
   must sign, else (after the expiry check of step 6) `signature_not_required`.
2. A signature without a key id: `forged`, `missing_key_id`.
3. Key id not in the ring: `forged`, `unknown_key`.
4. The signature must check against the version of the key valid at `at`. If
   no version is valid then, or that version's key does not check: `expired`,
   `key_not_valid_at_time` if the signature checks against another version of the id (a
   real key used outside its window: revoked, or not yet valid), else `forged`,
   `bad_signature` (also for a signature that is not 64 bytes). A forger never learns
   about windows. (A signature this process made over the same bytes with that version's
   key is known to check: `signedhere` answers for it with a hash, the same answer.)
5. Scope of that version: the source must match one of its `sources` patterns
   (`forged`, `key_not_allowed_for_source`); if the caller passes the `tool` the input
   answers for, one of its `tools` (`key_not_allowed_for_tool`); if it passes the
   thread's `tenant`, one of its `tenants` (`key_not_allowed_for_tenant`). A genuine key
   signing beyond its scope is an impersonation, hence `forged`.
6. `expires_at` at or before `at`: `expired`, `expired` (the input was dead when it
   reached the log). An input is live while ``at < expires_at``.
7. Otherwise `verified`, `signature_ok`.

`unbound` is not decided here: binding a result to a pending call of its thread (call id,
request id) is the processor's check, made with the thread's state.

Which sources sign. `SigningPolicy.required_sources` (default ``connector:*``, ``timer``,
``operator:*``) must sign; an unsigned input from them is `unsigned` /
`missing_signature`. This is the rule a reader of the envelope alone can apply. The
processor applies a stricter one before it gets here (`torpor.processors.fold.authority`):
each body type may come only from certain roles, every role but `user` signs
(`processor` included: a key ring needs a processor key), and a thread's tenant and
scopes must be granted by the key that signed its creation (docs/security.md). A source
that need not sign may still sign, and is then judged in full (a bad signature is
`forged`, never quietly `unsigned`).

Evolution and replay. Verification re-encodes the decoded body. If a body's schema
gains a field after an input was signed, an old input decoded under the new schema
re-encodes with the field's default and no longer verifies. Until verification covers
the writer's own bytes, evolve a signed body (ToolResult, ToolEvent, TimerFired,
ApprovalRequest, ApprovalDecision, Control) only with a new domain tag version, or keep
the receipts' verdicts as the replay's ground truth.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from torpor.schemas import signedhere
from torpor.schemas.codec import canonical_bytes, schema_for
from torpor.schemas.errors import ContractError
from torpor.schemas.keyring import KeyRing, KeyVersion, matches
from torpor.schemas.records import EXPIRED, FORGED, UNSIGNED, VERIFIED, Input

DOMAIN: Final = b"torpor-input-v1\x00"
SIGNATURE_LENGTH: Final = 64

# Reasons, for receipts. Each names one rule of the module docstring.
SIGNATURE_OK: Final = "signature_ok"
SIGNATURE_NOT_REQUIRED: Final = "signature_not_required"
MISSING_SIGNATURE: Final = "missing_signature"
MISSING_KEY_ID: Final = "missing_key_id"
UNKNOWN_KEY: Final = "unknown_key"
BAD_SIGNATURE: Final = "bad_signature"
KEY_NOT_VALID_AT_TIME: Final = "key_not_valid_at_time"
KEY_NOT_ALLOWED_FOR_SOURCE: Final = "key_not_allowed_for_source"
KEY_NOT_ALLOWED_FOR_TOOL: Final = "key_not_allowed_for_tool"
KEY_NOT_ALLOWED_FOR_TENANT: Final = "key_not_allowed_for_tenant"
INPUT_EXPIRED: Final = "expired"

DEFAULT_REQUIRED_SOURCES: Final = ("connector:*", "timer", "operator:*")
"""DESIGN section 3: connector, timer and operator inputs are signed by default."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The provenance of one input: a word of `records.py` and the rule that decided it.

    `provenance` is `verified`, `unsigned`, `forged` or `expired` (the processor adds
    `unbound`); `reason` is one of this module's reason constants, for the receipt;
    `key_id` is the key the input named, if any.
    """

    provenance: str
    reason: str
    key_id: str | None = None

    @property
    def is_verified(self) -> bool:
        return self.provenance == VERIFIED


@dataclass(frozen=True, slots=True)
class SigningPolicy:
    """Which sources must sign. Patterns as in the key ring (exact, or ending in ``*``)."""

    required_sources: tuple[str, ...] = DEFAULT_REQUIRED_SOURCES

    def requires_signature(self, source: str) -> bool:
        """True if `source` matches a pattern of `required_sources`."""
        return any(matches(p, source) for p in self.required_sources)


DEFAULT_POLICY: Final = SigningPolicy()


def _str(text: str) -> bytes:
    data = text.encode("utf-8")
    return len(data).to_bytes(4, "big") + data


def _blob(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def _i64(value: int) -> bytes:
    try:
        return value.to_bytes(8, "big", signed=True)
    except OverflowError:
        raise ContractError(f"time {value} does not fit an Avro long") from None


def signing_bytes(record: Input) -> bytes:
    """The bytes the signature of `record` covers (the rule of the module docstring).

    Deterministic: equal envelopes give equal bytes in every process. Raises
    `ContractError` if `record.key_id` is None (there is nothing to sign with), if a
    time does not fit a long, or if the body does not fit its schema.
    """
    if record.key_id is None:
        raise ContractError(f"input {record.message_id!r} has no key_id: set one before signing")
    expires = b"\x00" if record.expires_at is None else b"\x01" + _i64(record.expires_at)
    try:
        envelope = (
            _str(record.message_id),
            _str(record.thread_id),
            _str(record.source),
            _i64(record.created_at),
            expires,
            _str(record.key_id),
        )
    except UnicodeEncodeError as exc:
        raise ContractError(f"input {record.message_id!r}: an envelope string is not valid text") from exc
    body = (_str(schema_for(type(record.body)).name), _blob(canonical_bytes(record.body)))
    return b"".join((DOMAIN, *envelope, *body))


def sign(record: Input, key_id: str, private_key: Ed25519PrivateKey) -> Input:
    """A copy of `record` with `key_id` set and `signature` over `signing_bytes`.

    Ed25519 is deterministic: signing the same envelope with the same key gives the same
    signature, so a connector that re-produces a result after a crash writes the same
    bytes. Raises `ContractError` as `signing_bytes` does.
    """
    unsigned = dataclasses.replace(record, key_id=key_id, signature=None)
    message = signing_bytes(unsigned)
    signature = private_key.sign(message)
    signedhere.remember(private_key, signature, message)  # read back soon: checked by a hash
    return dataclasses.replace(unsigned, signature=signature)


def _checks(version: KeyVersion, signature: bytes, message: bytes) -> bool:
    if len(signature) != SIGNATURE_LENGTH:
        return False
    if signedhere.holds(version.public_key, signature, message):
        return True  # this process signed these bytes with this key (signedhere.py)
    try:
        _public_key(version.public_key).verify(signature, message)
    except InvalidSignature:
        return False
    return True


@functools.lru_cache(maxsize=1024)  # the ring's keys: loading one cost a few us per input
def _public_key(raw: bytes) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(raw)


def _is_expired(record: Input, at: int) -> bool:
    return record.expires_at is not None and record.expires_at <= at


def verify(
    record: Input,
    keyring: KeyRing,
    *,
    tool: str | None = None,
    tenant: str | None = None,
    policy: SigningPolicy = DEFAULT_POLICY,
    at: int | None = None,
) -> Verdict:
    """Judge `record`'s signature against `keyring` (the steps of the module docstring).

    `tool`: the tool the input answers for (the pending call's tool, for a result, an
    event, a timer or an approval request), or None when it names no call or the call is
    unknown: then tool scope is not checked. `tenant`: the tenant of the thread's
    capability, or None when the thread has none yet (its `CreateThread`). `at`: the time
    the input is judged at (key windows, `expires_at`): the broker's append time, which no
    writer chooses; None judges at the input's own `created_at`. Pure: the
    same arguments give the same verdict, whenever and wherever it runs. Never raises for
    bad input: a body that cannot be encoded is `forged`, `bad_signature`.
    """
    key_id = record.key_id
    moment = record.created_at if at is None else at
    if record.signature is None:
        if policy.requires_signature(record.source):
            return Verdict(UNSIGNED, MISSING_SIGNATURE, key_id)
        if _is_expired(record, moment):
            return Verdict(EXPIRED, INPUT_EXPIRED, key_id)
        return Verdict(UNSIGNED, SIGNATURE_NOT_REQUIRED, key_id)
    if key_id is None:
        return Verdict(FORGED, MISSING_KEY_ID)
    versions = keyring.versions(key_id)
    if not versions:
        return Verdict(FORGED, UNKNOWN_KEY, key_id)
    try:
        message = signing_bytes(record)
    except ContractError:
        # Nothing can have signed bytes that do not exist; a receipt, not a crash.
        return Verdict(FORGED, BAD_SIGNATURE, key_id)
    version = keyring.version_at(key_id, moment)
    if version is None or not _checks(version, record.signature, message):
        others = (v for v in versions if v is not version)
        if any(_checks(v, record.signature, message) for v in others):
            # A real key of this id, used at a time outside its own window.
            return Verdict(EXPIRED, KEY_NOT_VALID_AT_TIME, key_id)
        return Verdict(FORGED, BAD_SIGNATURE, key_id)
    if not version.may_sign_source(record.source):
        return Verdict(FORGED, KEY_NOT_ALLOWED_FOR_SOURCE, key_id)
    if tool is not None and not version.may_sign_tool(tool):
        return Verdict(FORGED, KEY_NOT_ALLOWED_FOR_TOOL, key_id)
    if tenant is not None and not version.may_sign_tenant(tenant):
        return Verdict(FORGED, KEY_NOT_ALLOWED_FOR_TENANT, key_id)
    if _is_expired(record, moment):
        return Verdict(EXPIRED, INPUT_EXPIRED, key_id)
    return Verdict(VERIFIED, SIGNATURE_OK, key_id)
