"""Deterministic message-id derivation: the rule every language reproduces.

The fold mints every new id (request ids, synthetic call ids, child thread ids, event
and receipt ids) from its input's `message_id`, and connectors derive result ids from a
dispatch's `request_id`, so a replay or a retry mints the same ids and duplicates are
absorbed. The rule, version 1::

    derive_id(base, p1, ..., pn) =
        "tp_" + lowercase_hex(SHA-256(
            "torpor.id.v1"                       (12 ASCII bytes, a domain tag)
            || u32be(len(utf8(base))) || utf8(base)
            || u32be(len(utf8(p1)))   || utf8(p1)
            ...
            || u32be(len(utf8(pn)))   || utf8(pn)
        ))[:32]

Each string is length-prefixed (4-byte big-endian byte count of its UTF-8), so
``("ab", "c")`` and ``("a", "bc")`` never collide and no separator character is reserved.
The result is always 35 characters of ``[a-z0-9_]`` (128 bits of the digest), short and
plain enough for any provider's tool-call id and any Kafka key. Test vectors are in
`tests/schemas/test_ids.py`; a client in another language should check them.

Wire ids. A thread id or message id that a producer chooses is 1 to `MAX_ID_LENGTH`
(256) characters of ``A-Z a-z 0-9`` and ``. _ : @ / + = ~ -`` (`ID_PATTERN`): no
spaces, no control characters, nothing that a terminal, a log line or a file name would
read as anything but the id. The processor refuses an input whose ids break the rule
(one `rejected:invalid_thread_id` or `rejected:invalid_message_id` receipt), and the
CLI refuses them before producing. Derived ids always keep it.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

PREFIX: Final = "tp_"
DOMAIN: Final = b"torpor.id.v1"
HEX_DIGITS: Final = 32
ID_LENGTH: Final = len(PREFIX) + HEX_DIGITS
MAX_ID_LENGTH: Final = 256
ID_PATTERN: Final = re.compile(r"[A-Za-z0-9._:@/+=~-]{1,256}")
_sha256: Final = hashlib.sha256


def id_problem(value: str) -> str | None:
    """Why `value` is not a wire id (module docstring), or None if it is one."""
    if not value:
        return "empty"
    if len(value) > MAX_ID_LENGTH:
        return f"{len(value)} characters, more than {MAX_ID_LENGTH}"
    if ID_PATTERN.fullmatch(value) is None:
        bad = next(c for c in value if ID_PATTERN.fullmatch(c) is None)
        return f"character {bad!r} is not allowed (letters, digits and ._:@/+=~- only)"
    return None


def derive_id(base: str, *parts: str) -> str:
    """The id derived from `base` (a message or request id) and `parts` (what is minted).

    Pure and deterministic: equal arguments give the same id in every process and
    language. Raises `UnicodeEncodeError` for a string that is not valid Unicode text
    (a lone surrogate), which no wire id can contain.
    """
    # Joined once and hashed in one call: an update per piece cost twice as much, and
    # growing a bytearray a fifth more than this.
    data = base.encode("utf-8")
    chunks = [DOMAIN, len(data).to_bytes(4, "big"), data]
    for text in parts:
        data = text.encode("utf-8")
        chunks.append(len(data).to_bytes(4, "big"))
        chunks.append(data)
    return PREFIX + _sha256(b"".join(chunks)).hexdigest()[:HEX_DIGITS]


def fork_creation_id(control_id: str, new_thread_id: str) -> str:
    """The message id of a fork's `CreateThread`: derived from the `fork` control's message id.

    The processor produces that input to the new thread; a client that asked for the fork
    waits for its receipt under this id (`applied`, or `rejected:thread_exists`, ...).
    """
    return derive_id(control_id, "fork", new_thread_id)


FORK_SUFFIX_HEX: Final = 8


def fork_thread_id(thread_id: str, nonce: str) -> str:
    """A new id for a fork of `thread_id`: `<thread_id>-fork-<first 8 characters of nonce>`,
    the thread's id cut so that the whole stays a wire id (the CLI and the page pass a random hex)."""
    suffix = f"-fork-{nonce[:FORK_SUFFIX_HEX]}"
    return thread_id[: MAX_ID_LENGTH - len(suffix)] + suffix
