"""`torpor approve APPROVAL_ID CHOICE`: a person's decision on a pending approval.

Output contract: `decided <approval id> <choice> (message <id>)` once the broker
acknowledged the `ApprovalDecision`, then its receipt as the processor folds it: the
fold checks it (unknown approval, expired, not one of the choices: a `rejected:<reason>`
receipt, and this command exits 1; so it does if no receipt comes within `--wait`,
default 30 s, `--wait 0` not waiting) and dispatches the decision to the tool that
asked. The thread comes from `--thread` (the `torpor tail` line of the request prints
it) or is looked up on the events topic, which keeps a day by default; the message id is
derived from the approval id and the choice, so approving twice is a duplicate, not a
second decision.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from torpor.cli.send import WAIT_OPTION_HELP, default_source, deliver, envelope
from torpor.cli.settings import read_settings, settings_options
from torpor.cli.signing import signer_for, signing_options, wire_id
from torpor.schemas.errors import TorporError
from torpor.schemas.ids import derive_id
from torpor.schemas.records import ApprovalDecision, ThreadEvent
from torpor.streams.config import Settings
from torpor.streams.deadline import Deadline
from torpor.streams.observer import Observed, Observer

LOOKUP_SECONDS = 60.0


def requested(settings: Settings, approval_id: str) -> tuple[str, list[str]] | None:
    """The thread and choices of the `approval_requested` event for `approval_id`, if retained."""
    with Observer(settings) as observer:
        found: tuple[str, list[str]] | None = None
        for step in observer.read(
            observer.start(at_end=False), until_end=True, deadline=Deadline.after(LOOKUP_SECONDS)
        ):
            item = step.item
            if not (isinstance(item, Observed) and isinstance(event := item.record, ThreadEvent)):
                continue
            if event.kind == "approval_requested" and event.data:
                data = json.loads(event.data)
                if isinstance(data, dict) and data.get("approval_id") == approval_id:
                    found = (event.thread_id, [str(c) for c in data.get("choices", [])])
        return found


@click.command("approve")
@click.argument("approval_id")
@click.argument("choice")
@click.option(
    "--thread", default=None, callback=wire_id,
    help="The thread that asked (default: look it up on the events topic).",
)
@click.option("--by", "decided_by", default=None,
              help="Who decides: user:<id> or operator:<id> (default user:<login name>).")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=30.0, show_default=True,
              metavar="SECONDS", help=WAIT_OPTION_HELP)
@signing_options
@settings_options
def approve(
    approval_id: str,
    choice: str,
    thread: str | None,
    decided_by: str | None,
    wait_s: float,
    signing_key_id: str | None,
    signing_key: Path | None,
    config_file: Path | None,
    bootstrap: str | None,
) -> None:
    """Decide APPROVAL_ID with CHOICE (one of the choices the tool offered).

    With a key ring, a decision is accepted only signed (--signing-key-id, --signing-key)
    by an operator's key or a gateway key of the thread's tenant.
    """
    signer = signer_for(signing_key_id, signing_key)
    settings = read_settings(config_file, bootstrap)
    who = decided_by or default_source()
    try:
        if thread is None:
            found = requested(settings, approval_id)
            if found is None:
                raise click.ClickException(
                    f"no approval {approval_id!r} on the events topic (expired from it, or never asked): "
                    "pass --thread THREAD"
                )
            thread, choices = found
            if choice not in choices:
                raise click.UsageError(f"{choice!r} is not one of the choices {choices}")
        message_id = derive_id(approval_id, "decision", choice)
        # An operator decides as `operator:<id>` (signed with an operator key); anyone else as a user.
        source = who if who.startswith(("user:", "operator:")) else f"user:{who}"
        record = envelope(thread, message_id, source,
                          ApprovalDecision(approval_id=approval_id, choice=choice, decided_by=who))
    except TorporError as error:
        raise click.ClickException(str(error)) from None
    deliver(settings, thread, [signer.sign(record) if signer is not None else record], wait_s,
            lambda _: click.echo(f"decided {approval_id} {choice} (message {message_id})"))
