"""`torpor keys new|list|show`: signing keys and the key ring (`torpor.schemas.keyring`).

`new` generates an Ed25519 key pair, writes the private key to ``<out-dir>/<id>.pem``
(PKCS#8 PEM, created with mode 0600; an existing file is never overwritten) and prints
the key ring entry for the public key on stdout; with ``--keyring FILE`` it also appends
the entry to that file (creating it), after checking that the ring with the new entry is
still valid, so a bad entry never reaches the file. `list` prints one line per key
version; `show ID` prints the entries of one id in the file format.

Exit codes: 0 ok; 1 a one-line cause on stderr (a bad argument, an invalid ring, a file
that exists or cannot be written).
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import click
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from torpor.schemas.errors import ConfigError
from torpor.schemas.keyring import (
    KeyRing,
    KeyVersion,
    datetime_to_ms,
    entry_toml,
    keyring_toml,
    load_keyring,
    ms_to_text,
    parse_keyring,
)
from torpor.schemas.signer import public_key_bytes, write_private_key

keyring_option = click.option(
    "--keyring",
    "keyring_file",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The key ring file (TOML).",
)


def _parse_time(text: str | None, option: str) -> int | None:
    if text is None:
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return datetime_to_ms(dt.datetime.fromisoformat(text))
    except ValueError:
        raise click.BadParameter(
            "give an RFC 3339 time with an offset (2026-12-02T00:00:00Z) or integer ms", param_hint=option
        ) from None
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


@click.group()
def keys() -> None:
    """Signing keys for connectors, timers and operators, and the key ring."""


@keys.command("new")
@click.option("--id", "key_id", required=True, help="The key id (letters, digits, '.', '_', '-').")
@click.option(
    "--source",
    "sources",
    multiple=True,
    required=True,
    help="A source pattern the key may sign for, e.g. connector:shell or operator:*. Repeatable.",
)
@click.option("--tool", "tools", multiple=True, help="A tool pattern (default: any). Repeatable.")
@click.option("--tenant", "tenants", multiple=True, help="A tenant pattern (default: any). Repeatable.")
@click.option("--scope", "scopes", multiple=True,
              help="A scope pattern a thread this key creates may hold (default: none). Repeatable.")
@click.option("--valid-from", default=None, help="Start of validity, RFC 3339 or ms (default: now).")
@click.option("--valid-until", default=None, help="End of validity, exclusive (default: none).")
@click.option(
    "--out-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the private key file <id>.pem (created with mode 0700 if missing).",
)
@click.option(
    "--keyring",
    "keyring_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also append the entry to this key ring file (created if missing).",
)
def new(
    key_id: str,
    sources: tuple[str, ...],
    tools: tuple[str, ...],
    tenants: tuple[str, ...],
    scopes: tuple[str, ...],
    valid_from: str | None,
    valid_until: str | None,
    out_dir: Path,
    keyring_file: Path | None,
) -> None:
    """Generate a key pair, write the private key, print the key ring entry."""
    start = _parse_time(valid_from, "--valid-from")
    private_key = Ed25519PrivateKey.generate()
    try:
        version = KeyVersion(
            key_id=key_id,
            public_key=public_key_bytes(private_key),
            sources=sources,
            tools=tools or ("*",),
            tenants=tenants or ("*",),
            scopes=scopes,
            # The shell may read the clock; the key ring then holds a fixed time.
            valid_from=start if start is not None else time.time_ns() // 1_000_000,
            valid_until=_parse_time(valid_until, "--valid-until"),
        )
        ring_text = None
        if keyring_file is not None:
            existing = load_keyring(keyring_file) if keyring_file.exists() else KeyRing()
            ring_text = keyring_toml(KeyRing((*existing.entries, version)))
            parse_keyring(ring_text, where=str(keyring_file))  # what we write must load
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    key_path = out_dir / f"{key_id}.pem"
    try:
        out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private_key(key_path, private_key)
    except FileExistsError:
        raise click.ClickException(f"{key_path} exists; choose another --id or --out-dir") from None
    except OSError as exc:
        raise click.ClickException(f"cannot write {key_path}: {exc.strerror or exc}") from None
    if keyring_file is not None:
        try:
            _append_entry(keyring_file, version)
        except OSError as exc:
            raise click.ClickException(f"cannot write {keyring_file}: {exc.strerror or exc}") from None
        click.echo(f"appended key {key_id!r} to {keyring_file}", err=True)
    click.echo(f"wrote private key {key_path} (mode 0600)", err=True)
    click.echo(entry_toml(version), nl=False)


def _append_entry(keyring_file: Path, version: KeyVersion) -> None:
    # Append rather than rewrite: the operator's comments and layout in the file stay.
    if not keyring_file.exists() or not keyring_file.read_text(encoding="utf-8").strip():
        keyring_file.write_text(keyring_toml(KeyRing((version,))), encoding="utf-8")
        return
    text = keyring_file.read_text(encoding="utf-8")
    separator = "\n" if text.endswith("\n") else "\n\n"
    with keyring_file.open("a", encoding="utf-8") as out:
        out.write(separator + entry_toml(version))


def _read(keyring_file: Path) -> KeyRing:
    try:
        return load_keyring(keyring_file)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


@keys.command("list")
@keyring_option
def list_keys(keyring_file: Path) -> None:
    """One line per key version: id, fingerprint, window, and what it may sign."""
    for v in _read(keyring_file).entries:
        until = "-" if v.valid_until is None else ms_to_text(v.valid_until)
        click.echo(
            f"{v.key_id}\t{v.fingerprint}\t{ms_to_text(v.valid_from)}\t{until}\t"
            f"sources={','.join(v.sources)}\ttools={','.join(v.tools)}\ttenants={','.join(v.tenants)}"
        )


@keys.command("show")
@click.argument("key_id")
@keyring_option
def show(key_id: str, keyring_file: Path) -> None:
    """The entries of KEY_ID, in the key ring file format. Exits 1 if there are none."""
    versions = _read(keyring_file).versions(key_id)
    if not versions:
        raise click.ClickException(f"key ring {keyring_file} has no key {key_id!r}")
    click.echo("\n".join(entry_toml(v) for v in versions), nl=False)
