"""The connector's `Signer`, its key file, and `torpor keys` end to end through click.

The end-to-end test is the operator's path: `torpor keys new` writes a private key and a
key ring entry, a connector loads the key from its settings and signs a result, and the
processor's check (`verify` against the ring the command wrote) finds it `verified`.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from torpor.cli import main
from torpor.schemas import records as r
from torpor.schemas import signing
from torpor.schemas.errors import ConfigError
from torpor.schemas.keyring import KeyRing, KeyVersion, load_keyring
from torpor.schemas.signer import Signer, SignerSettings, load_private_key, public_key_bytes

T0 = 1_800_000_000_000


def _result(source: str = "connector:shell", created_at: int = T0) -> r.Input:
    return r.Input(
        message_id="m1",
        thread_id="t1",
        created_at=created_at,
        source=source,
        expires_at=None,
        key_id=None,
        signature=None,
        body=r.ToolResult("c1", "rq1", True, (r.TextBlock("done"),), False),
    )


def _pem(key: Ed25519PrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _key_file(tmp_path: Path, data: bytes, mode: int = 0o600) -> Path:
    path = tmp_path / "shell-1.pem"
    path.write_bytes(data)
    path.chmod(mode)
    return path


# --- Signer -------------------------------------------------------------------------


def test_a_signer_from_settings_signs_what_the_ring_verifies(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    signer = Signer.from_settings(SignerSettings("shell-1", _key_file(tmp_path, _pem(key))))
    ring = KeyRing((KeyVersion("shell-1", public_key_bytes(key), ("connector:shell",)),))
    signed = signer.sign(_result())
    assert signed.key_id == "shell-1"
    assert signing.verify(signed, ring, tool="shell").is_verified
    assert signer.public_key == public_key_bytes(key)


def test_a_signer_is_deterministic() -> None:
    signer = Signer("shell-1", Ed25519PrivateKey.generate())
    assert signer.sign(_result()) == signer.sign(_result())


def test_the_private_key_never_appears_in_a_repr() -> None:
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    text = repr(Signer("shell-1", key))
    assert "shell-1" in text
    for secret in (raw.hex(), base64.b64encode(raw).decode(), str(raw), _pem(key).decode()):
        assert secret not in text


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = _key_file(tmp_path, _pem(Ed25519PrivateKey.generate()), mode=0o644)
    with pytest.raises(ConfigError, match=r"mode 0644 .*chmod 600"):
        load_private_key(path)


def test_a_missing_key_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_private_key(tmp_path / "absent.pem")


def test_a_file_that_is_not_a_pem_key_is_refused_without_quoting_it(tmp_path: Path) -> None:
    path = _key_file(tmp_path, b"secret-ish garbage")
    with pytest.raises(ConfigError, match="not an unencrypted PEM private key") as caught:
        load_private_key(path)
    assert "garbage" not in str(caught.value)


def test_a_key_of_another_algorithm_is_refused(tmp_path: Path) -> None:
    path = _key_file(tmp_path, _pem(ec.generate_private_key(ec.SECP256R1())))
    with pytest.raises(ConfigError, match="not an Ed25519 key"):
        load_private_key(path)


def test_a_key_id_the_ring_cannot_hold_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must match"):
        SignerSettings("../evil", tmp_path / "k.pem")
    with pytest.raises(ConfigError, match="must match"):
        Signer("", Ed25519PrivateKey.generate())


# --- torpor keys, end to end --------------------------------------------------------


def _keys_new(runner: CliRunner, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    result = runner.invoke(
        main,
        [
            "keys", "new", "--id", "shell-1", "--source", "connector:shell", "--tool", "shell",
            "--tenant", "acme", "--valid-from", "2027-01-01T00:00:00Z",
            "--out-dir", str(tmp_path / "keys"), *extra,
        ],
    )  # fmt: skip
    return result.exit_code, result.stdout, result.stderr


def test_keys_new_writes_a_key_a_connector_can_sign_with_and_a_ring_that_verifies_it(tmp_path: Path) -> None:
    runner = CliRunner()
    ring_file = tmp_path / "keyring.toml"
    code, out, err = _keys_new(runner, tmp_path, "--keyring", str(ring_file))
    assert code == 0, err
    key_file = tmp_path / "keys" / "shell-1.pem"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert "[[keys]]" in out and 'id = "shell-1"' in out
    assert "PRIVATE" not in out + err

    ring = load_keyring(ring_file)
    (version,) = ring.versions("shell-1")
    assert (version.sources, version.tools, version.tenants) == (("connector:shell",), ("shell",), ("acme",))
    signer = Signer.from_settings(SignerSettings("shell-1", key_file))
    assert signer.public_key == version.public_key
    signed = signer.sign(_result())
    assert signing.verify(signed, ring, tool="shell", tenant="acme") == signing.Verdict(
        r.VERIFIED, signing.SIGNATURE_OK, "shell-1"
    )
    early = signer.sign(_result(created_at=version.valid_from - 1))
    assert signing.verify(early, ring).reason == signing.KEY_NOT_VALID_AT_TIME


def test_keys_new_without_a_ring_prints_an_entry_that_parses(tmp_path: Path) -> None:
    code, out, err = _keys_new(CliRunner(), tmp_path)
    assert code == 0, err
    ring_file = tmp_path / "ring.toml"
    ring_file.write_text(out)
    assert load_keyring(ring_file).versions("shell-1")


def test_keys_new_appends_to_a_ring_and_keeps_what_was_there(tmp_path: Path) -> None:
    ring_file = tmp_path / "keyring.toml"
    ring_file.write_text("# ours: do not lose this comment\nformat = 1\n")
    runner = CliRunner()
    assert _keys_new(runner, tmp_path, "--keyring", str(ring_file))[0] == 0
    result = runner.invoke(
        main,
        ["keys", "new", "--id", "timer-1", "--source", "timer", "--out-dir", str(tmp_path / "keys"),
         "--keyring", str(ring_file)],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert ring_file.read_text().startswith("# ours: do not lose this comment\n")
    assert [v.key_id for v in load_keyring(ring_file).entries] == ["shell-1", "timer-1"]


def test_keys_new_never_overwrites_a_key(tmp_path: Path) -> None:
    runner = CliRunner()
    assert _keys_new(runner, tmp_path)[0] == 0
    before = (tmp_path / "keys" / "shell-1.pem").read_bytes()
    code, _, err = _keys_new(runner, tmp_path)
    assert code == 1 and "exists" in err
    assert (tmp_path / "keys" / "shell-1.pem").read_bytes() == before


def test_keys_new_refuses_an_entry_that_would_break_the_ring_and_writes_nothing(tmp_path: Path) -> None:
    ring_file = tmp_path / "keyring.toml"
    runner = CliRunner()
    assert _keys_new(runner, tmp_path, "--keyring", str(ring_file))[0] == 0
    text = ring_file.read_text()
    # Same id again, open-ended from the same time: the two versions would overlap.
    code, _, err = _keys_new(runner, tmp_path / "second", "--keyring", str(ring_file))
    assert code == 1 and "two versions valid at the same time" in err
    assert ring_file.read_text() == text
    assert not (tmp_path / "second").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--id", "a/b", "--source", "timer"], "must match"),
        (["--id", "k", "--source", "a*b"], "pattern 'a*b' is invalid"),
        (["--id", "k", "--source", "timer", "--valid-from", "yesterday"], "RFC 3339"),
        (["--id", "k", "--source", "timer", "--valid-from", "2027-01-01T00:00:00"], "no UTC offset"),
    ],
)
def test_keys_new_reports_a_bad_argument_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["keys", "new", *args, "--out-dir", str(tmp_path)])
    assert result.exit_code != 0
    assert message in result.stderr
    assert not list(tmp_path.iterdir())


def test_keys_list_and_show(tmp_path: Path) -> None:
    ring_file = tmp_path / "keyring.toml"
    runner = CliRunner()
    assert _keys_new(runner, tmp_path, "--keyring", str(ring_file))[0] == 0
    listed = runner.invoke(main, ["keys", "list", "--keyring", str(ring_file)])
    assert listed.exit_code == 0
    (line,) = listed.stdout.splitlines()
    version = load_keyring(ring_file).entries[0]
    assert line.split("\t")[:4] == ["shell-1", version.fingerprint, "2027-01-01T00:00:00.000Z", "-"]
    assert "sources=connector:shell" in line and "tools=shell" in line and "tenants=acme" in line

    shown = runner.invoke(main, ["keys", "show", "shell-1", "--keyring", str(ring_file)])
    assert shown.exit_code == 0 and 'id = "shell-1"' in shown.stdout
    missing = runner.invoke(main, ["keys", "show", "nope", "--keyring", str(ring_file)])
    assert missing.exit_code == 1 and "no key 'nope'" in missing.stderr


def test_keys_list_reports_a_malformed_ring(tmp_path: Path) -> None:
    ring_file = tmp_path / "keyring.toml"
    ring_file.write_text("[[keys]]\nid = 3\n")
    result = CliRunner().invoke(main, ["keys", "list", "--keyring", str(ring_file)])
    assert result.exit_code == 1 and f"key ring {ring_file}" in result.stderr


def test_a_signature_moved_to_another_input_is_forged_end_to_end(tmp_path: Path) -> None:
    assert _keys_new(CliRunner(), tmp_path, "--keyring", str(tmp_path / "ring.toml"))[0] == 0
    signer = Signer.from_settings(SignerSettings("shell-1", tmp_path / "keys" / "shell-1.pem"))
    signed = signer.sign(_result())
    other = dataclasses.replace(_result(), message_id="m2", key_id=signed.key_id, signature=signed.signature)
    verdict = signing.verify(other, load_keyring(tmp_path / "ring.toml"))
    assert (verdict.provenance, verdict.reason) == (r.FORGED, signing.BAD_SIGNATURE)
