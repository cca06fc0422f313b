"""The key ring of `torpor.schemas.keyring`: the file format, validity, and its errors."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torpor.schemas.errors import ConfigError
from torpor.schemas.keyring import (
    KeyRing,
    KeyVersion,
    datetime_to_ms,
    entry_toml,
    keyring_toml,
    load_keyring,
    matches,
    ms_to_text,
    parse_keyring,
)

PUBLIC = bytes(range(32))
PUBLIC_B64 = base64.b64encode(PUBLIC).decode()
T0 = 1_700_000_000_000

# --- strategies ---------------------------------------------------------------------

_plain = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="*"), min_size=1, max_size=12
)
patterns = st.one_of(_plain, _plain.map(lambda p: p + "*"), st.just("*"))
key_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)
times = st.integers(0, 4_102_444_800_000)


@st.composite
def versions(draw: st.DrawFn) -> KeyVersion:
    start = draw(times)
    end = draw(st.none() | st.integers(start + 1, start + 10**12))
    return KeyVersion(
        key_id=draw(key_ids),
        public_key=draw(st.binary(min_size=32, max_size=32)),
        sources=tuple(draw(st.lists(patterns, min_size=1, max_size=3))),
        tools=tuple(draw(st.lists(patterns, min_size=1, max_size=3))),
        tenants=tuple(draw(st.lists(patterns, min_size=1, max_size=3))),
        valid_from=start,
        valid_until=end,
        scopes=tuple(draw(st.lists(patterns, max_size=3))),
    )


def _entry(**fields: str) -> str:
    base = {
        "id": '"shell-1"',
        "public_key": f'"{PUBLIC_B64}"',
        "sources": '["connector:shell"]',
        "valid_from": "2026-12-01T00:00:00Z",
    }
    base.update(fields)
    return "[[keys]]\n" + "".join(f"{k} = {v}\n" for k, v in base.items() if v != "")


# --- round trips --------------------------------------------------------------------


@given(version=versions())
def test_an_entry_reads_back_equal(version: KeyVersion) -> None:
    assert parse_keyring(entry_toml(version)).entries == (version,)


@given(entries=st.lists(versions(), max_size=4, unique_by=lambda v: v.key_id),
       users_must_sign=st.booleans(), public_tools=st.lists(patterns, max_size=3))
def test_a_ring_reads_back_equal(entries: list[KeyVersion], users_must_sign: bool,
                                 public_tools: list[str]) -> None:
    ring = KeyRing(tuple(entries), users_must_sign=users_must_sign, public_tools=tuple(public_tools))
    assert parse_keyring(keyring_toml(ring)) == ring


def test_the_policy_is_read_and_defaults_to_nothing_public() -> None:
    assert (parse_keyring("").users_must_sign, parse_keyring("").public_tools) == (False, ())
    ring = parse_keyring('[policy]\nusers_must_sign = true\npublic_tools = ["echo", "search*"]\n')
    assert ring.users_must_sign and ring.is_public_tool("echo") and ring.is_public_tool("search-web")
    assert not ring.is_public_tool("shell")
    with pytest.raises(ConfigError, match="unknown \\[policy\\] field"):
        parse_keyring("[policy]\nuser_must_sign = true\n")


def test_a_ring_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "keyring.toml"
    entry = _entry(tools='["shell", "shell_*"]', valid_until="2027-01-01T00:00:00Z")
    path.write_text("format = 1\n\n" + entry)
    ring = load_keyring(path)
    (version,) = ring.versions("shell-1")
    assert version.public_key == PUBLIC
    assert version.sources == ("connector:shell",)
    assert version.tools == ("shell", "shell_*")
    assert version.tenants == ("*",)  # omitted: any
    assert version.valid_from == datetime_to_ms(dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    assert version.valid_until == datetime_to_ms(dt.datetime(2027, 1, 1, tzinfo=dt.UTC))
    assert len(ring) == 1 and ring.versions("other") == ()


def test_times_may_be_integer_ms_or_offset_datetimes() -> None:
    ring = parse_keyring(_entry(valid_from=str(T0), valid_until="2026-12-02T01:00:00.5+01:00"))
    (version,) = ring.entries
    assert version.valid_from == T0
    assert version.valid_until == datetime_to_ms(dt.datetime(2026, 12, 2, 0, 0, 0, 500_000, tzinfo=dt.UTC))


def test_an_empty_file_is_an_empty_ring() -> None:
    assert parse_keyring("") == KeyRing()


def test_ms_to_text_is_rfc3339_utc_with_milliseconds() -> None:
    assert ms_to_text(T0 + 7) == "2023-11-14T22:13:20.007Z"


# --- validity -----------------------------------------------------------------------


def test_a_version_is_valid_from_its_start_until_just_before_its_end() -> None:
    version = KeyVersion("k", PUBLIC, ("*",), valid_from=10, valid_until=20)
    assert [version.is_valid_at(t) for t in (9, 10, 19, 20)] == [False, True, True, False]
    assert KeyVersion("k", PUBLIC, ("*",), valid_from=10).is_valid_at(10**15)


def test_rotated_versions_of_one_id_are_picked_by_time() -> None:
    old = KeyVersion("k", PUBLIC, ("*",), valid_from=0, valid_until=100)
    new = KeyVersion("k", bytes(32), ("*",), valid_from=100)
    ring = KeyRing((old, new))
    assert ring.version_at("k", 99) == old
    assert ring.version_at("k", 100) == new
    assert ring.version_at("k", -1) is None
    assert ring.versions("k") == (old, new)


def test_overlapping_versions_of_one_id_are_refused() -> None:
    old = KeyVersion("k", PUBLIC, ("*",), valid_from=0, valid_until=101)
    new = KeyVersion("k", bytes(32), ("*",), valid_from=100)
    with pytest.raises(ConfigError, match="two versions valid at the same time"):
        KeyRing((old, new))


def test_open_ended_versions_of_one_id_overlap() -> None:
    with pytest.raises(ConfigError, match="'k' has two versions"):
        KeyRing((KeyVersion("k", PUBLIC, ("*",)), KeyVersion("k", PUBLIC, ("*",), valid_from=5)))


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("timer", "timer", True),
        ("timer", "timers", False),
        ("connector:*", "connector:shell", True),
        ("connector:*", "connector:", True),
        ("connector:*", "connector", False),
        ("*", "anything", True),
        ("operator:a", "operator:ab", False),
    ],
)
def test_patterns_are_exact_or_a_prefix_ending_in_a_star(pattern: str, value: str, expected: bool) -> None:
    assert matches(pattern, value) is expected


def test_scope_predicates() -> None:
    version = KeyVersion("k", PUBLIC, ("connector:shell",), tools=("shell_*",), tenants=("acme",))
    assert version.may_sign_source("connector:shell") and not version.may_sign_source("connector:http")
    assert version.may_sign_tool("shell_exec") and not version.may_sign_tool("http")
    assert version.may_sign_tenant("acme") and not version.may_sign_tenant("globex")


# --- malformed rings: each error names the file, the entry and the fix --------------

MALFORMED: dict[str, tuple[str, str]] = {
    "not toml": ("[[keys]\n", "not valid TOML"),
    "unknown top field": ("colour = 1\n", "unknown top-level field"),
    "future format": ("format = 2\n", "format 2 is not supported"),
    "keys not tables": ("keys = [1]\n", "array of tables"),
    "missing id": ("[[keys]]\nsources = []\n", "keys\\[0\\]: 'id' is required"),
    "id not a string": ("[[keys]]\nid = 3\n", "'id' is required and must be a string"),
    "bad id": (_entry(id='"a/b"'), "must match"),
    "unknown field": (_entry(source='["timer"]'), "unknown field\\(s\\) source"),
    "other algorithm": (_entry(algorithm='"rsa"'), "algorithm 'rsa' is not supported"),
    "missing public key": (_entry(public_key=""), "'public_key' is required"),
    "bad base64": (_entry(public_key='"not base64!"'), "not valid base64"),
    "short key": (_entry(public_key='"AAAA"'), "32 bytes, not 3"),
    "missing sources": (_entry(sources=""), "'sources' is required"),
    "empty sources": (_entry(sources="[]"), "at least one source"),
    "sources not strings": (_entry(sources="[1]"), "'sources' must be an array of strings"),
    "star inside": (_entry(tools='["a*b"]'), "tools pattern 'a\\*b' is invalid"),
    "empty tenants": (_entry(tenants="[]"), "tenants is empty"),
    "missing valid_from": (_entry(valid_from=""), "'valid_from' is required"),
    "naive time": (_entry(valid_from="2026-12-01T00:00:00"), "no UTC offset"),
    "boolean time": (_entry(valid_from="true"), "'valid_from' must be an offset date-time"),
    "end before start": (
        _entry(valid_until="2026-11-30T00:00:00Z"),
        "valid_until \\(\\d+\\) must be after valid_from",
    ),
    "overlap": (
        _entry() + _entry(public_key=f'"{base64.b64encode(bytes(32)).decode()}"'),
        "two versions valid at the same time",
    ),
}


@pytest.mark.parametrize(("text", "message"), MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_ring_is_a_config_error_that_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse_keyring(text, where="/etc/torpor/keyring.toml")
    assert str(caught.value).startswith("key ring /etc/torpor/keyring.toml")


def test_entry_errors_name_the_entry_and_its_id() -> None:
    text = _entry() + _entry(id='"http-1"', public_key='"AAAA"')
    with pytest.raises(ConfigError, match=r"keys\[1\] \(id 'http-1'\): .*32 bytes"):
        parse_keyring(text, where="ring.toml")


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_keyring(tmp_path / "absent.toml")


def test_a_binary_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "ring.toml"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=f"key ring {path}: cannot read it"):
        load_keyring(path)
