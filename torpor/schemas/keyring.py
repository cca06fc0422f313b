"""The key ring: which Ed25519 public keys may sign which inputs, and when.

Contract. `load_keyring(path)` reads a key ring file and returns a frozen `KeyRing`, or
raises `ConfigError` naming the file, the entry and what is wrong (refuse to start).
`KeyRing.versions(key_id)` gives every version of a key id; `KeyVersion` says what one
version may sign (`may_sign_source`, `may_sign_tool`, `may_sign_tenant`) and when it is
valid (`is_valid_at`). `entry_toml(version)` writes one entry in the file format, as
`torpor keys new` prints it. Nothing here reads a clock: validity is judged at a time
the caller passes in (the signing rule passes the input's own `created_at`).

The file is TOML (the format of Torpor's settings files)::

    format = 1                       # optional; the only format there is

    [policy]                         # optional
    users_must_sign = false          # true: every user input needs a key (a gateway's)
    public_tools = ["echo"]          # tool patterns a thread created without a key may
                                     # hold (default none)

    [[keys]]
    id = "shell-2026-12"             # the key id inputs carry in `key_id`
    algorithm = "ed25519"            # optional; the only algorithm there is
    public_key = "base64..."         # standard base64 of the 32 raw public key bytes
    sources = ["connector:shell"]    # required, non-empty: sources this key may sign for
    tools = ["shell"]                # optional, default ["*"]: tools it may answer for
    tenants = ["*"]                  # optional, default ["*"]: tenants it may act in
    scopes = ["payments:read"]       # optional, default []: scopes a thread it creates
                                     # may hold (a gateway's or an operator's key)
    valid_from = 2026-12-02T00:00:00Z    # required: a TOML offset date-time, or int ms
    valid_until = 2027-12-02T00:00:00Z   # optional: end of validity (exclusive)

Patterns: a pattern is either an exact string or ends in one ``*`` that matches any
suffix (``connector:*``, ``operator:*``, ``*``). A ``*`` anywhere else is refused, so
no character of a source, tool or tenant name is special.

Validity and rotation. A version is valid for times ``valid_from <= t < valid_until``
(ms since the epoch, UTC; sub-millisecond digits are dropped). An id may appear in
several entries: those are versions of one key id (a rotation that keeps the id), and
their windows must not overlap, so at most one version of an id is valid at any time.
Rotating to a new id works the same way and is simpler to audit. Never delete an entry
whose key signed inputs still in the `inputs` topic: a replay verifies each input again
against the version valid at its `created_at`, and must judge it as it was judged live.
End a key's use by giving it a `valid_until` instead.

Grants. A key that signs a root `CreateThread` grants the new thread its capability:
the thread's tenant must match the key's `tenants`, each of its tools the key's `tools`,
and each of its scopes the key's `scopes`, which default to none (a key grants no scope
unless it says so). `torpor.processors.fold.authority` applies this.

Unknown fields in an entry are refused (a misspelt ``source =`` would otherwise widen
nothing and narrow nothing silently).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from torpor.schemas.errors import ConfigError

FORMAT: Final = 1
ALGORITHM: Final = "ed25519"
PUBLIC_KEY_LENGTH: Final = 32
ANY: Final = "*"

KEY_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Key ids are plain enough to be file names (`torpor keys new` writes ``<id>.pem``)."""

_ENTRY_FIELDS: Final = frozenset(
    {"id", "algorithm", "public_key", "sources", "tools", "tenants", "scopes", "valid_from", "valid_until"}
)
_TOP_FIELDS: Final = frozenset({"format", "policy", "keys"})
_POLICY_FIELDS: Final = frozenset({"users_must_sign", "public_tools"})
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MILLISECOND: Final = dt.timedelta(milliseconds=1)


def fingerprint(public_key: bytes) -> str:
    """A short, stable name for a public key: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def is_valid_pattern(pattern: str) -> bool:
    """True if `pattern` is non-empty, has no control character, and any ``*`` is its last."""
    if not pattern or any(ord(c) < 0x20 or ord(c) == 0x7F for c in pattern):
        return False
    star = pattern.find(ANY)
    return star == -1 or star == len(pattern) - 1


def matches(pattern: str, value: str) -> bool:
    """True if `value` is `pattern`, or starts with `pattern` less its trailing ``*``."""
    if pattern.endswith(ANY):
        return value.startswith(pattern[:-1])
    return value == pattern


def _matches_any(patterns: tuple[str, ...], value: str) -> bool:
    return any(matches(p, value) for p in patterns)


@dataclass(frozen=True, slots=True)
class KeyVersion:
    """One entry of the key ring: a public key, what it may sign, and when.

    Raises `ConfigError` on construction if the id, the key, a pattern or the window is
    invalid, so a `KeyVersion` that exists is well formed.
    """

    key_id: str
    public_key: bytes
    sources: tuple[str, ...]
    tools: tuple[str, ...] = (ANY,)
    tenants: tuple[str, ...] = (ANY,)
    valid_from: int = 0
    valid_until: int | None = None
    scopes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not KEY_ID_PATTERN.fullmatch(self.key_id):
            raise ConfigError(
                f"key id {self.key_id!r} must match {KEY_ID_PATTERN.pattern} (it names the key's file)"
            )
        if len(self.public_key) != PUBLIC_KEY_LENGTH:
            raise ConfigError(
                f"key {self.key_id!r}: an Ed25519 public key is {PUBLIC_KEY_LENGTH} bytes, "
                f"not {len(self.public_key)}"
            )
        if not self.sources:
            raise ConfigError(f"key {self.key_id!r}: sources must list at least one source pattern")
        for name, patterns in (("sources", self.sources), ("tools", self.tools), ("tenants", self.tenants),
                               ("scopes", self.scopes)):
            if not patterns and name != "scopes":
                raise ConfigError(f"key {self.key_id!r}: {name} is empty (omit it to allow any)")
            for pattern in patterns:
                if not is_valid_pattern(pattern):
                    raise ConfigError(
                        f"key {self.key_id!r}: {name} pattern {pattern!r} is invalid: a pattern is a "
                        "non-empty string with at most one '*', at its end"
                    )
        if self.valid_until is not None and self.valid_until <= self.valid_from:
            raise ConfigError(
                f"key {self.key_id!r}: valid_until ({self.valid_until}) must be after "
                f"valid_from ({self.valid_from})"
            )

    @property
    def fingerprint(self) -> str:
        """A short, stable name for the public key (see `fingerprint`)."""
        return fingerprint(self.public_key)

    def is_valid_at(self, time_ms: int) -> bool:
        """True if ``valid_from <= time_ms < valid_until`` (no `valid_until`: no end)."""
        return self.valid_from <= time_ms and (self.valid_until is None or time_ms < self.valid_until)

    def may_sign_source(self, source: str) -> bool:
        """True if a source pattern of this key matches `source`."""
        return _matches_any(self.sources, source)

    def may_sign_tool(self, tool: str) -> bool:
        """True if a tool pattern of this key matches `tool`."""
        return _matches_any(self.tools, tool)

    def may_sign_tenant(self, tenant: str) -> bool:
        """True if a tenant pattern of this key matches `tenant`."""
        return _matches_any(self.tenants, tenant)

    def may_grant_scope(self, scope: str) -> bool:
        """True if a scope pattern of this key matches `scope` (a key without `scopes` grants none)."""
        return _matches_any(self.scopes, scope)

    def overlaps(self, other: KeyVersion) -> bool:
        """True if the validity windows of the two versions share a millisecond."""
        starts_before_other_ends = other.valid_until is None or self.valid_from < other.valid_until
        other_starts_before_end = self.valid_until is None or other.valid_from < self.valid_until
        return starts_before_other_ends and other_starts_before_end


@dataclass(frozen=True, slots=True)
class KeyRing:
    """Every key version this deployment trusts. Immutable: reload the file for a new ring.

    Raises `ConfigError` on construction if two versions of one id have overlapping
    windows (then a time could pick either, and a verdict would depend on file order).
    """

    entries: tuple[KeyVersion, ...] = ()
    users_must_sign: bool = False
    """`[policy] users_must_sign`: user inputs need a key too (else only `ApprovalDecision`)."""
    public_tools: tuple[str, ...] = ()
    """`[policy] public_tools`: tool patterns a thread created without a key may hold."""
    _by_id: Mapping[str, tuple[KeyVersion, ...]] = field(
        init=False, repr=False, compare=False, hash=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        by_id: dict[str, tuple[KeyVersion, ...]] = {}
        for version in self.entries:
            for earlier in by_id.get(version.key_id, ()):
                if version.overlaps(earlier):
                    raise ConfigError(
                        f"key {version.key_id!r} has two versions valid at the same time "
                        f"({_window(earlier)} and {_window(version)}): give the older one a "
                        "valid_until at or before the newer one's valid_from"
                    )
            by_id[version.key_id] = (*by_id.get(version.key_id, ()), version)
        # An index built once: a processor looks a key up for every signed input.
        object.__setattr__(self, "_by_id", by_id)

    def is_public_tool(self, tool: str) -> bool:
        """True if a pattern of `public_tools` matches `tool`."""
        return _matches_any(self.public_tools, tool)

    def versions(self, key_id: str) -> tuple[KeyVersion, ...]:
        """Every version of `key_id`, in file order; empty if the ring does not know it."""
        return self._by_id.get(key_id, ())

    def version_at(self, key_id: str, time_ms: int) -> KeyVersion | None:
        """The version of `key_id` valid at `time_ms`, or None (at most one is, by construction)."""
        for version in self.versions(key_id):
            if version.is_valid_at(time_ms):
                return version
        return None

    def __len__(self) -> int:
        return len(self.entries)


def _window(version: KeyVersion) -> str:
    until = "forever" if version.valid_until is None else ms_to_text(version.valid_until)
    return f"{ms_to_text(version.valid_from)} .. {until}"


# --- times --------------------------------------------------------------------------


def ms_to_text(time_ms: int) -> str:
    """`time_ms` as an RFC 3339 UTC time with milliseconds, e.g. ``2026-12-02T18:41:47.123Z``."""
    moment = _EPOCH + dt.timedelta(milliseconds=time_ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def datetime_to_ms(moment: dt.datetime) -> int:
    """Milliseconds since the epoch of an aware `moment` (sub-millisecond digits dropped)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ConfigError(f"time {moment.isoformat()} has no UTC offset: write it with Z or +HH:MM")
    return (moment - _EPOCH) // _MILLISECOND


# --- the file -----------------------------------------------------------------------


def load_keyring(path: Path) -> KeyRing:
    """Read and validate the key ring file at `path`.

    Raises `ConfigError` naming `path` if the file cannot be read, is not TOML, or any
    entry is invalid.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"key ring {path}: cannot read it: {exc}") from exc
    return parse_keyring(text, where=str(path))


def parse_keyring(text: str, *, where: str = "<key ring>") -> KeyRing:
    """Parse key ring TOML `text`; `where` names it in errors. Raises `ConfigError`."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"key ring {where}: not valid TOML: {exc}") from exc
    unknown = sorted(set(document) - _TOP_FIELDS)
    if unknown:
        raise ConfigError(f"key ring {where}: unknown top-level field(s) {', '.join(unknown)}")
    version = document.get("format", FORMAT)
    if version != FORMAT:
        raise ConfigError(
            f"key ring {where}: format {version!r} is not supported (this build reads {FORMAT})"
        )
    policy = document.get("policy", {})
    if not isinstance(policy, dict):
        raise ConfigError(f"key ring {where}: 'policy' must be a table ([policy])")
    unknown = sorted(set(policy) - _POLICY_FIELDS)
    if unknown:
        raise ConfigError(f"key ring {where}: unknown [policy] field(s) {', '.join(unknown)}")
    users_must_sign = policy.get("users_must_sign", False)
    if not isinstance(users_must_sign, bool):
        raise ConfigError(f"key ring {where}: [policy] users_must_sign must be true or false")
    public_tools = _patterns(policy, "public_tools", f"key ring {where}: [policy]", default=())
    for pattern in public_tools:
        if not is_valid_pattern(pattern):
            raise ConfigError(f"key ring {where}: [policy] public_tools pattern {pattern!r} is invalid")
    tables = document.get("keys", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"key ring {where}: 'keys' must be an array of tables ([[keys]])")
    entries = tuple(_entry(table, f"key ring {where}: keys[{i}]") for i, table in enumerate(tables))
    try:
        return KeyRing(entries, users_must_sign=users_must_sign, public_tools=public_tools)
    except ConfigError as exc:
        raise ConfigError(f"key ring {where}: {exc}") from None


def _entry(table: dict[str, object], where: str) -> KeyVersion:
    key_id = table.get("id")
    if not isinstance(key_id, str):
        raise ConfigError(f"{where}: 'id' is required and must be a string")
    where = f"{where} (id {key_id!r})"
    unknown = sorted(set(table) - _ENTRY_FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
    algorithm = table.get("algorithm", ALGORITHM)
    if algorithm != ALGORITHM:
        raise ConfigError(f"{where}: algorithm {algorithm!r} is not supported (only {ALGORITHM!r})")
    encoded = table.get("public_key")
    if not isinstance(encoded, str):
        raise ConfigError(f"{where}: 'public_key' is required: base64 of the 32 raw Ed25519 key bytes")
    try:
        public_key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where}: public_key is not valid base64") from None
    if "sources" not in table:
        raise ConfigError(f"{where}: 'sources' is required, e.g. sources = [\"connector:shell\"]")
    if "valid_from" not in table:
        raise ConfigError(f"{where}: 'valid_from' is required, e.g. valid_from = 2026-12-02T00:00:00Z")
    try:
        return KeyVersion(
            key_id=key_id,
            public_key=public_key,
            sources=_patterns(table, "sources", where),
            tools=_patterns(table, "tools", where),
            tenants=_patterns(table, "tenants", where),
            scopes=_patterns(table, "scopes", where, default=()),
            valid_from=_time(table["valid_from"], "valid_from", where),
            valid_until=None
            if "valid_until" not in table
            else _time(table["valid_until"], "valid_until", where),
        )
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith(where) else f"{where}: {message}") from None


def _patterns(table: dict[str, object], name: str, where: str,
              default: tuple[str, ...] = (ANY,)) -> tuple[str, ...]:
    value = table.get(name, list(default))
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {name!r} must be an array of strings")
    return tuple(str(v) for v in value)


def _time(value: object, name: str, where: str) -> int:
    # bool is an int in Python; `valid_from = true` is a mistake, not the epoch plus 1 ms.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, dt.datetime):
        try:
            return datetime_to_ms(value)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {name}: {exc}") from None
    raise ConfigError(
        f"{where}: {name!r} must be an offset date-time (2026-12-02T00:00:00Z) or integer ms since the epoch"
    )


def _toml_string(text: str) -> str:
    """`text` as a TOML basic string: quotes, backslashes and control characters escaped."""
    out = ['"']
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _toml_array(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(_toml_string(v) for v in values) + "]"


def entry_toml(version: KeyVersion) -> str:
    """One ``[[keys]]`` table for `version`, in the file format, ending in a newline.

    `parse_keyring` reads it back to an equal `KeyVersion` (tested).
    """
    lines = [
        "[[keys]]",
        f"id = {_toml_string(version.key_id)}",
        f"algorithm = {_toml_string(ALGORITHM)}",
        f"public_key = {_toml_string(base64.b64encode(version.public_key).decode('ascii'))}",
        f"sources = {_toml_array(version.sources)}",
        f"tools = {_toml_array(version.tools)}",
        f"tenants = {_toml_array(version.tenants)}",
        f"scopes = {_toml_array(version.scopes)}",
        f"valid_from = {ms_to_text(version.valid_from)}",
    ]
    if version.valid_until is not None:
        lines.append(f"valid_until = {ms_to_text(version.valid_until)}")
    return "\n".join(lines) + "\n"


def keyring_toml(ring: KeyRing) -> str:
    """The whole ring in the file format (a header, then one table per entry)."""
    header = f"# Torpor key ring: public keys and what each may sign.\nformat = {FORMAT}\n"
    if ring.users_must_sign or ring.public_tools:
        header += (f"\n[policy]\nusers_must_sign = {'true' if ring.users_must_sign else 'false'}\n"
                   f"public_tools = {_toml_array(ring.public_tools)}\n")
    return header + "".join("\n" + entry_toml(v) for v in ring.entries)
