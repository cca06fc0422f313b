"""What a processor trusts, read once from its `[inputs]` settings: how it judges inputs,
and the key it signs its own inputs with.

`verifier_for(settings)`: `KeyringVerifier` over the key ring file of `[inputs] keyring`
/ `TORPOR_KEYRING` (read once, at start: an unreadable or invalid file is a
`ConfigError`), else `SourceVerifier`, with a warning (development mode). A key ring
needs a processor key (`TORPOR_PROCESSOR_KEY_ID`, `TORPOR_PROCESSOR_KEY`; a `ConfigError`
without one), since unsigned inputs claiming to be the processor's are refused.
`trust_for(settings)`: the same verifier and the processor's signer, from one reading of
the ring; the signer's public key must be in the ring with source `processor`. A replay
needs only the verifier (and not the processor's private key): `verifier_for`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from torpor.processors.fold.verify import PROCESSOR_SOURCE, KeyringVerifier, SourceVerifier, Verifier
from torpor.schemas.errors import ConfigError
from torpor.schemas.keyring import KeyRing, load_keyring
from torpor.schemas.signer import Signer, SignerSettings
from torpor.streams.config import InputSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Trust:
    """How a processor judges inputs, and its own signer (None in development mode)."""

    verifier: Verifier
    signer: Signer | None


def trust_for(settings: InputSettings) -> Trust:
    """The processor's verifier and signer (module docstring), the key ring read once."""
    ring = _ring(settings)
    if ring is None:
        return Trust(SourceVerifier(), None)
    return Trust(KeyringVerifier(ring), _processor_signer(settings, ring))


def verifier_for(settings: InputSettings) -> Verifier:
    """The verifier a processor with `settings` runs (module docstring)."""
    ring = _ring(settings)
    return SourceVerifier() if ring is None else KeyringVerifier(ring)


def _ring(settings: InputSettings) -> KeyRing | None:
    if settings.keyring is None:
        log.warning("no key ring configured (TORPOR_KEYRING): development mode, input signatures "
                    "are not verified and unsigned connector, timer and operator inputs are accepted")
        return None
    ring = load_keyring(settings.keyring)
    if settings.processor_key_id is None:
        raise ConfigError(
            f"key ring {settings.keyring} is configured but the processor has no key of its own: its "
            "completions and loopbacks must be signed, or anyone who may produce to the inputs topic "
            "could forge them. Make one with `torpor keys new --id <id> --source processor --keyring "
            f"{settings.keyring} ...` and set TORPOR_PROCESSOR_KEY_ID and TORPOR_PROCESSOR_KEY"
        )
    log.info("verifying inputs against key ring %s (%d key versions%s)", settings.keyring, len(ring),
             "; users must sign" if ring.users_must_sign else "")
    return ring


def _processor_signer(settings: InputSettings, ring: KeyRing) -> Signer:
    """The processor's own signer, checked against `ring`.

    Raises `ConfigError` if the key file cannot be loaded, or the ring has no version of
    the key id with this public key allowed to sign for source `processor`.
    """
    assert settings.processor_key_id is not None  # _ring refused a ring without one
    if settings.processor_key is None:
        raise ConfigError("the processor's signing key id is set but not its file (TORPOR_PROCESSOR_KEY)")
    signer = Signer.from_settings(SignerSettings(settings.processor_key_id, settings.processor_key))
    if not any(v.public_key == signer.public_key and v.may_sign_source(PROCESSOR_SOURCE)
               for v in ring.versions(signer.key_id)):
        raise ConfigError(
            f"key ring {settings.keyring} has no version of key {signer.key_id!r} with this processor "
            f"key's public key ({signer.fingerprint}) allowed for source {PROCESSOR_SOURCE!r}: add it "
            f"with `torpor keys new --id {signer.key_id} --source {PROCESSOR_SOURCE} --keyring "
            f"{settings.keyring} ...` (or append the entry `torpor keys show` prints)"
        )
    return signer
