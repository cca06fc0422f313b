"""What a command needs to produce inputs the processor will accept: a key, and good ids.

`signing_options` adds `--signing-key-id` and `--signing-key` (or `TORPOR_SIGNING_KEY_ID`
and `TORPOR_SIGNING_KEY`) to a command; `signer_for` turns them into a `Signer`, or None
when neither is given. With a key ring, the processor refuses operator commands and
approval decisions without a key, and user inputs to a tenant's threads without one of
that tenant's gateway keys (docs/security.md).

`wire_id` is a click callback that refuses an id the processor would refuse
(`torpor.schemas.ids`: empty, too long, a space or a control character) before
anything is produced.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from torpor.schemas.errors import TorporError
from torpor.schemas.ids import id_problem
from torpor.schemas.signer import Signer, SignerSettings

F = TypeVar("F", bound=Callable[..., object])


def signing_options(command: F) -> F:
    """Add `--signing-key-id` and `--signing-key` to a click command."""
    command = click.option(
        "--signing-key", envvar="TORPOR_SIGNING_KEY", default=None,
        type=click.Path(dir_okay=False, path_type=Path), help="The private key file of --signing-key-id.",
    )(command)
    command = click.option(
        "--signing-key-id", envvar="TORPOR_SIGNING_KEY_ID", default=None,
        help="Sign with this key id (needed when the processor has a key ring).",
    )(command)
    return command


def signer_for(key_id: str | None, key: Path | None) -> Signer | None:
    """The signer of `--signing-key-id` and `--signing-key`; None if neither is given.

    Raises `click.UsageError` for one without the other, `click.ClickException` when the
    key cannot be loaded.
    """
    if (key_id is None) != (key is None):
        raise click.UsageError("give both --signing-key-id and --signing-key, or neither")
    if key_id is None or key is None:
        return None
    try:
        return Signer.from_settings(SignerSettings(key_id, key))
    except TorporError as error:
        raise click.ClickException(str(error)) from None


def wire_id(_: click.Context, parameter: click.Parameter, value: str | None) -> str | None:
    """A click callback: `value` unchanged, or `click.BadParameter` if the processor would refuse it."""
    if value is None:
        return None
    problem = id_problem(value)
    if problem is not None:
        raise click.BadParameter(f"{value[:80]!r} is not an id the processor accepts: {problem}",
                                 param=parameter)
    return value
