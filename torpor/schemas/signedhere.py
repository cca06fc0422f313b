"""Signatures this process made itself, so checking one of them costs a hash, not Ed25519.

The processor signs each completion the model stage produces and reads it back from
`inputs` a moment later, where the verifier checks it against the key ring like any
input: an Ed25519 verification (about 100 us here) of a signature made in the same
process. `signing.sign` remembers (public key, signature, SHA-256 of the signed bytes)
of what it signs; `signing.verify` asks `holds` first and, for a hit, skips the
Ed25519 check, whose answer is known: a signature made with a private key checks
against its public key over the same bytes. Everything else verify does (key id, key
windows, scopes, expiry) is unchanged.

It cannot admit a forgery: an entry is made only by signing, keyed by the public key
of the private key that signed (not by a key id), and matches only the same signature
over bytes with the same SHA-256. A record whose bytes differ, or a key ring whose
entry for the key id holds another public key, misses and is verified in full.
Bounded (the newest `CAPACITY` signatures; a completion is read back within one
checkpoint) and thread-safe (the stage signs on its thread, the loop verifies on its own).
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

CAPACITY: Final = 8192
"""About 1 MiB: a signature, a key and a digest each (64 + 32 + 32 bytes) and the dict's own."""

_lock: Final = threading.Lock()
# An OrderedDict: its oldest entry is dropped in O(1); a dict's `next(iter(...))` scans
# past the slots of every key popped since the dict last resized (microseconds at 8,192).
_made: OrderedDict[tuple[bytes, bytes], bytes] = OrderedDict()


@functools.lru_cache(maxsize=64)  # a process signs with one key or a few
def public_bytes(private_key: Ed25519PrivateKey) -> bytes:
    """The raw public key of `private_key` (32 bytes)."""
    return private_key.public_key().public_bytes_raw()


def remember(private_key: Ed25519PrivateKey, signature: bytes, message: bytes) -> None:
    """`private_key` just signed `message` with `signature`."""
    entry = (public_bytes(private_key), signature)
    digest = hashlib.sha256(message).digest()
    with _lock:
        _made[entry] = digest
        _made.move_to_end(entry)
        if len(_made) > CAPACITY:
            _made.popitem(last=False)  # the oldest


def holds(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True if this process signed exactly `message` with `signature` under `public_key`."""
    with _lock:
        digest = _made.get((public_key, signature))
    return digest is not None and digest == hashlib.sha256(message).digest()


def forget() -> None:
    """Drop every entry (tests)."""
    with _lock:
        _made.clear()
