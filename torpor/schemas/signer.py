"""A signer: one private key, used to sign every input a connector (or a processor) produces.

Contract. `Signer(key_id, private_key)` signs with `torpor.schemas.signing.sign`;
`Signer.from_settings(SignerSettings(key_id, private_key_file))` loads the key once, at
start-up, from an unencrypted PKCS#8 PEM file (what `torpor keys new` writes) and raises
`ConfigError` if the file is missing, unreadable, readable by group or others, or not an
Ed25519 private key: refuse to start rather than produce inputs the processor will judge
`forged` or `unsigned`. The private key never appears in a repr or an error message.

The key ring entry that goes with the key (`torpor keys new` prints it) must allow the
connector's `source` and the tools it answers for, or every input it signs is judged
`forged` (`key_not_allowed_for_source` / `_tool`). A processor's key signs its loopback
inputs and model completions (source `processor`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from torpor.schemas import signing
from torpor.schemas.errors import ConfigError
from torpor.schemas.keyring import KEY_ID_PATTERN, fingerprint
from torpor.schemas.records import Input


@dataclass(frozen=True, slots=True)
class SignerSettings:
    """Where a connector's signing key is: its key id and the PEM file of its private key.

    Validated on construction: raises `ConfigError` for a key id the key ring could not hold.
    """

    key_id: str
    private_key_file: Path

    def __post_init__(self) -> None:
        if not KEY_ID_PATTERN.fullmatch(self.key_id):
            raise ConfigError(f"signing key id {self.key_id!r} must match {KEY_ID_PATTERN.pattern}")


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in PEM file `path`.

    Raises `ConfigError` if the file cannot be read, grants any access to group or others
    (as ssh does: a key others could read is a key others may hold), or does not hold an
    unencrypted Ed25519 private key. Messages name the file, never its contents.
    """
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"signing key {path}: cannot read it: {exc.strerror or exc}") from None
    if stat.S_IMODE(mode) & 0o077:
        raise ConfigError(
            f"signing key {path}: mode {stat.S_IMODE(mode):04o} lets group or others read or write it; "
            f"run `chmod 600 {path}` (in Kubernetes, mount the secret with defaultMode 0400)"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        # The library's message may quote the data; say only what is wrong.
        raise ConfigError(
            f"signing key {path}: not an unencrypted PEM private key (write one with `torpor keys new`)"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"signing key {path}: holds a {type(key).__name__}, not an Ed25519 key")
    return key


def write_private_key(path: Path, key: Ed25519PrivateKey) -> None:
    """Write `key` to a new PEM file `path` that `load_private_key` accepts.

    Raises `FileExistsError` if `path` exists: a key that may be in use is never overwritten.
    """
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # O_EXCL refuses an existing file; mode 0600 from the first byte, so there is no moment
    # when the key is readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)


def public_key_bytes(private_key: Ed25519PrivateKey) -> bytes:
    """The 32 raw bytes of the public half of `private_key` (what the key ring holds)."""
    return private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class Signer:
    """Signs a connector's inputs with one key. Safe to share: signing keeps no state."""

    __slots__ = ("_key_id", "_private_key", "_public_key")

    def __init__(self, key_id: str, private_key: Ed25519PrivateKey) -> None:
        if not KEY_ID_PATTERN.fullmatch(key_id):
            raise ConfigError(f"signing key id {key_id!r} must match {KEY_ID_PATTERN.pattern}")
        self._key_id = key_id
        self._private_key = private_key
        self._public_key = public_key_bytes(private_key)

    @classmethod
    def from_settings(cls, settings: SignerSettings) -> Signer:
        """A signer with the key of `settings`. Raises `ConfigError` as `load_private_key` does."""
        return cls(settings.key_id, load_private_key(settings.private_key_file))

    @property
    def key_id(self) -> str:
        return self._key_id

    @property
    def public_key(self) -> bytes:
        """The raw public key, to compare with the key ring entry."""
        return self._public_key

    @property
    def fingerprint(self) -> str:
        """The public key's fingerprint, as the key ring and `torpor keys list` show it."""
        return fingerprint(self._public_key)

    def sign(self, record: Input) -> Input:
        """A copy of `record` signed with this key (`key_id` and `signature` set).

        Deterministic: the same record gives the same signature. Raises `ContractError`
        if the record does not fit its schema (a bug in the connector).
        """
        return signing.sign(record, self._key_id, self._private_key)

    def __repr__(self) -> str:
        return f"Signer(key_id={self._key_id!r}, fingerprint={self.fingerprint!r})"
