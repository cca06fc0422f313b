"""A signature this process made is checked by a hash, and nothing else is: `signedhere`.

Each test says which path `signing.verify` took by counting the Ed25519 checks (the
ring's public keys loaded for one), and what it answered. A hit must answer what the
full check answers; anything that differs from what was signed must miss and get the
full check (and its verdict).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tests.schemas.test_signing import KEY, OTHER_KEY, RING, T0, _raw, _result, _version
from torpor.schemas import records as r
from torpor.schemas import signedhere, signing
from torpor.schemas.keyring import KeyRing


@pytest.fixture
def full_checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """The public keys `signing.verify` ran Ed25519 with, in order; the memo starts empty."""
    signedhere.forget()
    checked: list[bytes] = []
    load = signing._public_key.__wrapped__

    def counting(raw: bytes) -> Ed25519PublicKey:
        checked.append(raw)
        return load(raw)

    monkeypatch.setattr(signing, "_public_key", counting)
    yield checked
    signedhere.forget()


def test_a_record_signed_here_is_verified_without_ed25519(full_checks: list[bytes]) -> None:
    signed = signing.sign(_result(), "shell-1", KEY)
    verdict = signing.verify(signed, RING)
    assert (verdict.provenance, verdict.reason) == (r.VERIFIED, signing.SIGNATURE_OK)
    assert full_checks == []


def test_a_record_signed_elsewhere_gets_the_full_check(full_checks: list[bytes]) -> None:
    unsigned = dataclasses.replace(_result(), key_id="shell-1")
    elsewhere = dataclasses.replace(unsigned, signature=KEY.sign(signing.signing_bytes(unsigned)))
    verdict = signing.verify(elsewhere, RING)
    assert (verdict.provenance, verdict.reason) == (r.VERIFIED, signing.SIGNATURE_OK)
    assert full_checks == [_raw(KEY)]


def test_the_signature_made_here_on_other_bytes_is_forged(full_checks: list[bytes]) -> None:
    signed = signing.sign(_result(), "shell-1", KEY)
    moved = dataclasses.replace(signed, thread_id="t2")  # same signature, other envelope
    assert (signing.verify(moved, RING).provenance, signing.verify(moved, RING).reason) == (
        r.FORGED, signing.BAD_SIGNATURE)
    assert full_checks and set(full_checks) == {_raw(KEY)}


def test_a_ring_that_holds_another_key_under_the_id_is_not_fooled(full_checks: list[bytes]) -> None:
    signed = signing.sign(_result(), "shell-1", KEY)
    other = KeyRing((_version(key=OTHER_KEY),))
    verdict = signing.verify(signed, other)
    assert (verdict.provenance, verdict.reason) == (r.FORGED, signing.BAD_SIGNATURE)
    assert full_checks == [_raw(OTHER_KEY)]


def test_a_key_window_still_judges_a_signature_made_here(full_checks: list[bytes]) -> None:
    signed = signing.sign(_result(), "shell-1", KEY)
    closed = KeyRing((_version(valid_until=T0 + 1),))
    verdict = signing.verify(signed, closed, at=T0 + 2)
    assert (verdict.provenance, verdict.reason) == (r.EXPIRED, signing.KEY_NOT_VALID_AT_TIME)


def test_the_memo_keeps_only_the_newest_signatures(full_checks: list[bytes]) -> None:
    first = signing.sign(_result(message_id="m-0"), "shell-1", KEY)
    for n in range(1, signedhere.CAPACITY + 1):
        signing.sign(_result(message_id=f"m-{n}"), "shell-1", KEY)
    assert signing.verify(first, RING).provenance == r.VERIFIED  # forgotten: checked in full
    assert full_checks == [_raw(KEY)]
