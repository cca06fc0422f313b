"""The signing rule of `torpor.schemas.signing`: bytes, sign, verify, and every verdict.

`test_signing_bytes_match_the_published_vector` is the test vector for other languages:
key seed ``00 01 .. 1f``, the input built by `_vector_input`, the exact signed bytes and
signature.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.schemas.strategies import inputs, records
from torpor.schemas import records as r
from torpor.schemas import signing
from torpor.schemas.codec import canonical_bytes
from torpor.schemas.errors import ContractError
from torpor.schemas.keyring import KeyRing, KeyVersion

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
OTHER_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
T0 = 1_700_000_000_000
DAY = 86_400_000


def _raw(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _version(key_id: str = "shell-1", key: Ed25519PrivateKey = KEY, **changes: object) -> KeyVersion:
    fields: dict[str, object] = {
        "key_id": key_id,
        "public_key": _raw(key),
        "sources": ("connector:shell",),
        "tools": ("shell",),
        "tenants": ("acme",),
        "valid_from": T0 - DAY,
        "valid_until": None,
    }
    fields.update(changes)
    return KeyVersion(**fields)  # type: ignore[arg-type]


RING = KeyRing((_version(),))


def _result(**changes: object) -> r.Input:
    record = r.Input(
        message_id="m1",
        thread_id="t1",
        created_at=T0,
        source="connector:shell",
        expires_at=None,
        key_id=None,
        signature=None,
        body=r.ToolResult(
            call_id="c1", request_id="rq1", ok=True, content=(r.TextBlock("hi"),), subscription=False
        ),
    )
    return dataclasses.replace(record, **changes)  # type: ignore[arg-type]


def _signed(**changes: object) -> r.Input:
    return signing.sign(_result(**changes), "shell-1", KEY)


def _verify(record: r.Input, ring: KeyRing = RING, **kwargs: typing.Any) -> tuple[str, str]:
    verdict = signing.verify(record, ring, **kwargs)
    return verdict.provenance, verdict.reason


# --- the rule -----------------------------------------------------------------------


def _vector_input() -> r.Input:
    return _result(key_id="shell-1")


VECTOR_BYTES = (
    "746f72706f722d696e7075742d763100000000026d310000000274310000000f636f6e6e6563746f723a736865"
    "6c6c0000018bcfe5680000000000077368656c6c2d3100000011746f72706f722e546f6f6c526573756c740000"
    "000f046331067271310102000468690000"
)
VECTOR_SIGNATURE = (
    "dc7d16d6c5437b3a56fdd0b6e87e94f61e268f0570aaf62a1e70af85622b0df9"
    "8487b06aacab767451bc632e8680c539bbbad3be7df7a048d4e9db8a8e7d9d0b"
)


def test_signing_bytes_match_the_published_vector() -> None:
    record = _vector_input()
    assert signing.signing_bytes(record).hex() == VECTOR_BYTES
    assert signing.sign(record, "shell-1", KEY).signature == bytes.fromhex(VECTOR_SIGNATURE)


def test_signing_bytes_are_laid_out_as_documented() -> None:
    record = _result(key_id="k", expires_at=T0 + 5)

    def s(text: str) -> bytes:
        return len(text.encode()).to_bytes(4, "big") + text.encode()

    body = canonical_bytes(record.body)
    expected = (
        b"torpor-input-v1\x00"
        + s("m1")
        + s("t1")
        + s("connector:shell")
        + T0.to_bytes(8, "big")
        + b"\x01"
        + (T0 + 5).to_bytes(8, "big")
        + s("k")
        + s("torpor.ToolResult")
        + len(body).to_bytes(4, "big")
        + body
    )
    assert signing.signing_bytes(record) == expected


def test_signing_bytes_mark_a_missing_expiry_with_one_zero_byte() -> None:
    with_expiry = signing.signing_bytes(_result(key_id="k", expires_at=0))
    without = signing.signing_bytes(_result(key_id="k"))
    assert len(with_expiry) == len(without) + 8


def test_signing_bytes_refuse_an_input_without_a_key_id() -> None:
    with pytest.raises(ContractError, match="no key_id"):
        signing.signing_bytes(_result())


def test_the_body_record_name_is_signed_so_the_branch_cannot_be_swapped() -> None:
    # Two bodies whose field bytes are equal differ only by their record name.
    fired = _result(key_id="k", body=r.TimerFired(call_id="a", request_id="b", due_at=0))
    report = _result(key_id="k", body=r.ParentMessage(parent_thread_id="a", spawn_call_id="b", text=""))
    assert canonical_bytes(fired.body) == canonical_bytes(report.body)
    assert signing.signing_bytes(fired) != signing.signing_bytes(report)
    swapped = dataclasses.replace(signing.sign(fired, "shell-1", KEY), body=report.body)
    assert _verify(swapped, source_any_ring()) == (r.FORGED, signing.BAD_SIGNATURE)


def source_any_ring() -> KeyRing:
    return KeyRing((_version(sources=("*",), tools=("*",), tenants=("*",)),))


# --- round trips --------------------------------------------------------------------

BODY_CLASSES = typing.get_args(r.InputBody)


@pytest.mark.parametrize("body_class", BODY_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_sign_then_verify_round_trips_for_every_body(body_class: type, data: st.DataObject) -> None:
    record = data.draw(inputs(body=records(body_class)))
    record = dataclasses.replace(
        record,
        created_at=data.draw(st.integers(T0 - DAY, T0 + 365 * DAY)),
        expires_at=data.draw(st.none() | st.integers(T0 + 366 * DAY, T0 + 400 * DAY)),
    )
    signed = signing.sign(record, "shell-1", KEY)
    assert signed.key_id == "shell-1" and signed.signature is not None
    assert dataclasses.replace(signed, key_id=record.key_id, signature=record.signature) == record
    assert _verify(signed, source_any_ring()) == (r.VERIFIED, signing.SIGNATURE_OK)


@settings(max_examples=50, deadline=None)
@given(record=inputs())
def test_signing_is_deterministic(record: r.Input) -> None:
    record = dataclasses.replace(record, key_id="k")
    assert signing.signing_bytes(record) == signing.signing_bytes(dataclasses.replace(record))
    assert signing.sign(record, "k", KEY) == signing.sign(record, "k", KEY)


def test_sign_replaces_an_old_signature_and_leaves_the_original_alone() -> None:
    original = _result(key_id="old", signature=b"x" * 64)
    signed = signing.sign(original, "shell-1", KEY)
    assert original.key_id == "old" and original.signature == b"x" * 64
    assert _verify(signed, tool="shell", tenant="acme") == (r.VERIFIED, signing.SIGNATURE_OK)


def test_verify_reads_no_clock_the_same_input_gets_the_same_verdict_forever() -> None:
    # An input signed years ago, by a key retired since, still verifies on replay:
    # the key's window is judged at the input's created_at, not at "now".
    retired = KeyRing((_version(valid_from=0, valid_until=T0 + 1),))
    assert _verify(_signed(), retired) == (r.VERIFIED, signing.SIGNATURE_OK)


# --- tampering ----------------------------------------------------------------------


TAMPERINGS: typing.Final[dict[str, dict[str, object]]] = {
    "message_id": {"message_id": "m2"},
    "thread_id": {"thread_id": "t2"},
    "source": {"source": "connector:shelm"},
    "created_at": {"created_at": T0 + 1},
    "expires_at added": {"expires_at": T0 + DAY},
    "body field": {"body": r.ToolResult("c1", "rq1", False, (r.TextBlock("hi"),), False)},
    "body content": {"body": r.ToolResult("c1", "rq1", True, (r.TextBlock("hj"),), False)},
}


@pytest.mark.parametrize("changes", TAMPERINGS.values(), ids=TAMPERINGS.keys())
def test_a_changed_signed_field_is_forged(changes: dict[str, object]) -> None:
    tampered = dataclasses.replace(_signed(), **changes)  # type: ignore[arg-type]
    ring = KeyRing((_version(sources=("connector:*",)),))
    assert _verify(tampered, ring) == (r.FORGED, signing.BAD_SIGNATURE)


def test_a_removed_expiry_is_forged() -> None:
    signed = _signed(expires_at=T0 + DAY)
    assert _verify(dataclasses.replace(signed, expires_at=None)) == (r.FORGED, signing.BAD_SIGNATURE)


def test_the_key_id_is_signed_a_signature_cannot_move_to_a_wider_entry() -> None:
    # Same public key under a second id with a wider scope: the signature does not carry over.
    ring = KeyRing((_version(), _version("wide", sources=("*",), tools=("*",), tenants=("*",))))
    moved = dataclasses.replace(_signed(), key_id="wide")
    assert _verify(moved, ring) == (r.FORGED, signing.BAD_SIGNATURE)


def test_every_flipped_bit_of_the_signed_bytes_breaks_the_signature() -> None:
    signed = _signed()
    assert signed.signature is not None
    message = signing.signing_bytes(signed)
    public = KEY.public_key()
    public.verify(signed.signature, message)
    for i in range(len(message)):
        flipped = bytearray(message)
        flipped[i] ^= 0x01
        with pytest.raises(InvalidSignature):
            public.verify(signed.signature, bytes(flipped))


def test_every_flipped_byte_of_the_signature_is_forged() -> None:
    signed = _signed()
    assert signed.signature is not None
    for i in range(len(signed.signature)):
        bad = bytearray(signed.signature)
        bad[i] ^= 0x80
        assert _verify(dataclasses.replace(signed, signature=bytes(bad))) == (r.FORGED, signing.BAD_SIGNATURE)


@pytest.mark.parametrize("signature", [b"", b"\x00" * 63, b"\x00" * 65], ids=["empty", "short", "long"])
def test_a_signature_of_the_wrong_length_is_forged(signature: bytes) -> None:
    assert _verify(dataclasses.replace(_signed(), signature=signature)) == (r.FORGED, signing.BAD_SIGNATURE)


def test_a_signature_by_another_key_is_forged() -> None:
    forged = signing.sign(_result(), "shell-1", OTHER_KEY)
    assert _verify(forged) == (r.FORGED, signing.BAD_SIGNATURE)


def test_an_input_whose_body_cannot_be_encoded_is_forged_not_a_crash() -> None:
    signed = dataclasses.replace(_signed(), created_at=2**63)
    assert _verify(signed) == (r.FORGED, signing.BAD_SIGNATURE)


# --- keys ---------------------------------------------------------------------------


def test_an_unknown_key_is_forged() -> None:
    signed = signing.sign(_result(), "nobody", KEY)
    assert signing.verify(signed, RING) == signing.Verdict(r.FORGED, signing.UNKNOWN_KEY, "nobody")


def test_a_signature_without_a_key_id_is_forged() -> None:
    record = dataclasses.replace(_signed(), key_id=None)
    assert _verify(record) == (r.FORGED, signing.MISSING_KEY_ID)


def test_a_key_not_yet_valid_is_expired() -> None:
    ring = KeyRing((_version(valid_from=T0 + 1),))
    assert _verify(_signed(), ring) == (r.EXPIRED, signing.KEY_NOT_VALID_AT_TIME)


def test_a_key_past_its_valid_until_is_expired() -> None:
    ring = KeyRing((_version(valid_until=T0),))  # valid_until is exclusive
    assert _verify(_signed(), ring) == (r.EXPIRED, signing.KEY_NOT_VALID_AT_TIME)
    assert _verify(_signed(created_at=T0 - 1), ring) == (r.VERIFIED, signing.SIGNATURE_OK)


def test_a_forgery_outside_the_key_window_is_forged_not_expired() -> None:
    ring = KeyRing((_version(valid_until=T0),))
    forged = signing.sign(_result(), "shell-1", OTHER_KEY)
    assert _verify(forged, ring) == (r.FORGED, signing.BAD_SIGNATURE)


def test_a_rotated_key_verifies_old_inputs_with_the_old_version_and_new_with_the_new() -> None:
    ring = KeyRing(
        (
            _version(valid_from=T0 - DAY, valid_until=T0 + DAY),
            _version(key=OTHER_KEY, valid_from=T0 + DAY),
        )
    )
    old = _signed()
    new = signing.sign(_result(created_at=T0 + 2 * DAY), "shell-1", OTHER_KEY)
    assert _verify(old, ring) == (r.VERIFIED, signing.SIGNATURE_OK)
    assert _verify(new, ring) == (r.VERIFIED, signing.SIGNATURE_OK)
    # The retired key signing after the rotation is a real key used out of its window.
    late = signing.sign(_result(created_at=T0 + 2 * DAY), "shell-1", KEY)
    assert _verify(late, ring) == (r.EXPIRED, signing.KEY_NOT_VALID_AT_TIME)


# --- scope --------------------------------------------------------------------------


def test_a_key_signing_for_another_source_is_forged() -> None:
    signed = _signed(source="connector:http")
    assert _verify(signed) == (r.FORGED, signing.KEY_NOT_ALLOWED_FOR_SOURCE)


def test_a_key_signing_for_another_tool_is_forged() -> None:
    assert _verify(_signed(), tool="http_get") == (r.FORGED, signing.KEY_NOT_ALLOWED_FOR_TOOL)
    assert _verify(_signed(), tool="shell") == (r.VERIFIED, signing.SIGNATURE_OK)


def test_a_key_signing_in_another_tenant_is_forged() -> None:
    assert _verify(_signed(), tenant="globex") == (r.FORGED, signing.KEY_NOT_ALLOWED_FOR_TENANT)
    assert _verify(_signed(), tenant="acme") == (r.VERIFIED, signing.SIGNATURE_OK)


def test_tool_and_tenant_are_not_checked_when_the_caller_has_none() -> None:
    assert _verify(_signed(), tool=None, tenant=None) == (r.VERIFIED, signing.SIGNATURE_OK)


def test_patterns_widen_a_key_by_prefix() -> None:
    ring = KeyRing((_version(sources=("operator:*",), tools=("*",), tenants=("acme-*",)),))
    signed = _signed(source="operator:alice")
    assert _verify(signed, ring, tool="anything", tenant="acme-eu") == (r.VERIFIED, signing.SIGNATURE_OK)
    assert _verify(signed, ring, tenant="acme") == (r.FORGED, signing.KEY_NOT_ALLOWED_FOR_TENANT)
    assert _verify(_signed(source="operator"), ring) == (r.FORGED, signing.KEY_NOT_ALLOWED_FOR_SOURCE)


# --- expiry -------------------------------------------------------------------------


@pytest.mark.parametrize("expires_at", [T0 - 1, T0], ids=["before", "at"])
def test_an_input_expiring_at_or_before_its_creation_is_expired(expires_at: int) -> None:
    assert _verify(_signed(expires_at=expires_at)) == (r.EXPIRED, signing.INPUT_EXPIRED)


def test_an_input_expiring_after_its_creation_is_verified() -> None:
    assert _verify(_signed(expires_at=T0 + 1)) == (r.VERIFIED, signing.SIGNATURE_OK)


def test_a_forged_expired_input_is_forged() -> None:
    forged = signing.sign(_result(expires_at=T0 - 1), "shell-1", OTHER_KEY)
    assert _verify(forged) == (r.FORGED, signing.BAD_SIGNATURE)


def test_an_unsigned_expired_user_input_is_expired() -> None:
    record = _result(source="user:bob", expires_at=T0)
    assert _verify(record) == (r.EXPIRED, signing.INPUT_EXPIRED)


# --- which sources sign -------------------------------------------------------------


@pytest.mark.parametrize("source", ["connector:shell", "timer", "operator:alice"])
def test_sources_that_must_sign_are_unsigned_without_a_signature(source: str) -> None:
    assert _verify(_result(source=source)) == (r.UNSIGNED, signing.MISSING_SIGNATURE)


@pytest.mark.parametrize("source", ["user:bob", "processor"])
def test_users_and_the_processor_need_not_sign(source: str) -> None:
    assert _verify(_result(source=source)) == (r.UNSIGNED, signing.SIGNATURE_NOT_REQUIRED)


def test_a_source_that_need_not_sign_is_still_judged_when_it_signs() -> None:
    ring = KeyRing((_version(sources=("user:*",)),))
    assert _verify(_signed(source="user:bob"), ring) == (r.VERIFIED, signing.SIGNATURE_OK)
    bad = dataclasses.replace(_signed(source="user:bob"), thread_id="t9")
    assert _verify(bad, ring) == (r.FORGED, signing.BAD_SIGNATURE)


def test_the_policy_can_require_the_processor_to_sign() -> None:
    policy = signing.SigningPolicy(required_sources=(*signing.DEFAULT_REQUIRED_SOURCES, "processor"))
    assert policy.requires_signature("processor")
    assert not policy.requires_signature("user:bob")
    assert _verify(_result(source="processor"), policy=policy) == (r.UNSIGNED, signing.MISSING_SIGNATURE)


def test_a_verdict_is_a_small_frozen_value() -> None:
    verdict = signing.verify(_signed(), RING)
    assert verdict.is_verified and verdict.key_id == "shell-1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.reason = "x"  # type: ignore[misc]
