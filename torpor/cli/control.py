"""`torpor control THREAD COMMAND`: an operator's command to a thread.

Output contract: `sent <command> to <thread> (message <id>)` once the broker acknowledged
the `Control` input, then its receipt as the processor folds it (`receipt <id> <disposition>
(<reason>)`): exit 1 if it is refused (a thread that does not exist: `rejected:unknown_thread`)
or does not come within `--wait` (default 30 s; `--wait 0` does not wait).
Commands: `stop`, `resume`, `park`, `unpark`, `compact`, `delete`, `set_model --model M`
(applies from the thread's next completion), `cancel_call --call-id ID`. The source is
`operator:<name>`; a processor with a key ring accepts operator inputs only when signed,
so `--signing-key-id` and `--signing-key` (a key `torpor keys new --source operator:<name>`
made) sign it. `--message-id` makes a retried command a duplicate. A fork (also a
`Control`, but with two receipts on two threads) has its own command: `torpor fork`.
"""

from __future__ import annotations

import getpass
import uuid
from pathlib import Path
from typing import Final

import click

from torpor.cli.send import WAIT_OPTION_HELP, deliver, envelope
from torpor.cli.settings import read_settings, settings_options
from torpor.cli.signing import signer_for, signing_options, wire_id
from torpor.schemas.ids import derive_id
from torpor.schemas.records import Control

COMMANDS: Final = ("stop", "resume", "park", "unpark", "cancel_call", "compact", "delete", "set_model")


@click.command("control")
@click.argument("thread", callback=wire_id)
@click.argument("command", type=click.Choice(COMMANDS))
@click.option("--model", default=None, help="set_model: the model string (openai:<m>, anthropic:<m>, ...).")
@click.option("--call-id", default=None, help="cancel_call: the pending call to cancel.")
@click.option("--reason", default=None, help="Why (kept in the receipt and the event).")
@click.option("--operator", default=None, help="Who sends it (default: the login name).")
@click.option("--message-id", default=None, callback=wire_id,
              help="A stable id, so a retried command is a duplicate.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=30.0, show_default=True,
              metavar="SECONDS", help=WAIT_OPTION_HELP)
@signing_options
@settings_options
def control(thread: str, command: str, model: str | None, call_id: str | None, reason: str | None,
            operator: str | None, message_id: str | None, wait_s: float, signing_key_id: str | None,
            signing_key: Path | None, config_file: Path | None, bootstrap: str | None) -> None:
    """Send COMMAND to THREAD as an operator (stop, unpark, set_model --model M, ...)."""
    if (command == "set_model") != (model is not None):
        raise click.UsageError("--model goes with set_model, and set_model needs it")
    if (command == "cancel_call") != (call_id is not None):
        raise click.UsageError("--call-id goes with cancel_call, and cancel_call needs it")
    signer = signer_for(signing_key_id, signing_key)
    settings = read_settings(config_file, bootstrap)
    record = envelope(thread, message_id or derive_id(thread, "control", command, uuid.uuid4().hex),
                      f"operator:{operator or getpass.getuser()}",
                      Control(command=command, call_id=call_id, model=model, reason=reason))
    if signer is not None:
        record = signer.sign(record)
    deliver(settings, thread, [record], wait_s,
            lambda _: click.echo(f"sent {command} to {thread} (message {record.message_id})"))
