"""`torpor fork THREAD --at SEQ [--as NEW_ID] [--model M]`: a new thread from THREAD's history.

The new thread's history is THREAD's entries 0 to SEQ (inclusive, as `torpor history`
numbers them), then it goes on: it asks the model if the last kept entry is input the
model has not answered, else it waits for the next input (`torpor send NEW_ID ...`).
`--model` gives the fork another model; `--as` names it (default `<thread>-fork-<8 hex>`,
derived from `--message-id` when there is one, so a retry names the same fork).

It is an operator's `fork` control on THREAD (`docs/wire-contract.md`): the processor of
THREAD's partition checks it and produces the fork's `CreateThread` to the new thread's
partition, where it is folded. So there are two receipts, and the command waits for
both (`--wait`, default 30 s; `--wait 0` does not wait):

    sent fork of <thread> at <seq> as <new> (message <id>)
    receipt <id> applied                   the control, on THREAD
    receipt <creation id> applied          the fork's creation, on NEW_ID
    forked <thread> at <seq> as <new>

Exit 1 if either is refused (`rejected:fork_seq_out_of_range`, `rejected:thread_exists`,
...) or does not come in time. Signing as for `torpor control`.
"""

from __future__ import annotations

import getpass
import uuid
from pathlib import Path

import click

from torpor.cli.send import envelope, produce_inputs
from torpor.cli.settings import read_settings, settings_options
from torpor.cli.signing import signer_for, signing_options, wire_id
from torpor.schemas.errors import TorporError
from torpor.schemas.ids import PREFIX as DERIVED_PREFIX
from torpor.schemas.ids import derive_id, fork_creation_id, fork_thread_id
from torpor.schemas.records import APPLIED, DUPLICATE, Control, Input, Receipt
from torpor.streams.config import Settings
from torpor.streams.deadline import Deadline
from torpor.streams.observer import Observed, Observer


@click.command("fork")
@click.argument("thread", callback=wire_id)
@click.option("--at", "at_seq", type=click.IntRange(min=0), required=True, metavar="SEQ",
              help="The last entry of THREAD's history the fork keeps (as `torpor history` numbers them).")
@click.option("--as", "new_id", default=None, callback=wire_id, metavar="NEW_ID",
              help="The new thread's id (default: <thread>-fork-<8 hex>).")
@click.option("--model", default=None, help="The fork's model (default: THREAD's current model).")
@click.option("--reason", default=None, help="Why (kept in the control, for the audit trail).")
@click.option("--operator", default=None, help="Who asks (default: the login name).")
@click.option("--message-id", default=None, callback=wire_id,
              help="A stable id, so a retried fork is a duplicate.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=30.0, show_default=True,
              metavar="SECONDS", help="Wait this long for both receipts; exit 1 if one is refused or late. "
                                      "0: do not wait.")
@signing_options
@settings_options
def fork(thread: str, at_seq: int, new_id: str | None, model: str | None, reason: str | None,
         operator: str | None, message_id: str | None, wait_s: float, signing_key_id: str | None,
         signing_key: Path | None, config_file: Path | None, bootstrap: str | None) -> None:
    """Fork THREAD at entry SEQ into a new thread (optionally with another model)."""
    if model is not None and not model.strip():
        raise click.UsageError("--model is empty: leave it out to keep the thread's model")
    # With --message-id, the default new id derives from it: a retry (a duplicate the
    # processor absorbs) names the fork the first try made, not a random one never made.
    nonce = derive_id(message_id, "fork new id")[len(DERIVED_PREFIX):] if message_id else uuid.uuid4().hex
    new_id = new_id or fork_thread_id(thread, nonce)
    if new_id == thread:
        raise click.UsageError("--as names the thread being forked: a fork needs a new id")
    signer = signer_for(signing_key_id, signing_key)
    settings = read_settings(config_file, bootstrap)
    body = Control(command="fork", call_id=None, model=model, reason=reason, new_thread_id=new_id,
                   at_seq=at_seq)
    record = envelope(thread, message_id or derive_id(thread, "fork", new_id, uuid.uuid4().hex),
                      f"operator:{operator or getpass.getuser()}", body)
    if signer is not None:
        record = signer.sign(record)
    try:
        _deliver(settings, record, new_id, at_seq, wait_s)
    except TorporError as error:
        raise click.ClickException(str(error)) from None


def _deliver(settings: Settings, record: Input, new_id: str, at_seq: int, wait_s: float) -> None:
    thread = record.thread_id
    sent = f"sent fork of {thread} at {at_seq} as {new_id} (message {record.message_id})"
    if not wait_s:
        produce_inputs(settings, [record])
        click.echo(sent)
        return
    creation = fork_creation_id(record.message_id, new_id)
    threads = [thread, new_id]
    with Observer(settings, receipts=True) as observer:
        start = observer.start(at_end=True, threads=threads)  # before producing: no receipt is missed
        produce_inputs(settings, [record])
        click.echo(sent)
        waiting = {(thread, record.message_id), (new_id, creation)}
        try:
            for item in observer.follow(start, threads=threads, deadline=Deadline.after(wait_s)):
                receipt = item.record if isinstance(item, Observed) else None
                if not isinstance(receipt, Receipt) or (receipt.thread_id, receipt.input_id) not in waiting:
                    continue
                waiting.discard((receipt.thread_id, receipt.input_id))
                why = f" ({receipt.reason})" if receipt.reason else ""
                click.echo(f"receipt {receipt.input_id} {receipt.disposition}{why}")
                if receipt.disposition not in (APPLIED, DUPLICATE):
                    raise click.ClickException(f"not forked: {receipt.disposition}{why}")
                if receipt.disposition == DUPLICATE and receipt.input_id == record.message_id:
                    # Asked for before: the fork's creation was produced (and judged) then.
                    click.echo(f"this fork was asked for before; its creation is message {creation}")
                    return
                if not waiting:
                    break
        except TimeoutError:
            raise click.ClickException(
                f"no receipt for {sorted(i for _, i in waiting)} within {wait_s:g} s: the control is on the "
                "topic; is a processor running for this topic prefix?") from None
    click.echo(f"forked {thread} at {at_seq} as {new_id}")
