"""`torpor tail [THREAD]`: follow the events of one thread (and its children) or of all.

Output contract: one line per record (`torpor.cli.render`): live model deltas, turns,
tool calls, results, child threads as a tree, pending approvals (with the `torpor
approve` command that decides them), and with `--receipts` every receipt. Records are
read_committed from `events` (and `receipts`), so aborted work never shows.

Resuming: after each line is printed, the position just past its record and the
renderer's names are saved to the resume file (default `.torpor/tail/<prefix><thread or
ALL>.json`; written whole and renamed, so a crash leaves the old or the new file, never
half of one). A tail started again with the same file continues from the next record:
what two runs print, one after the other, is what one run would have printed. Killed
with SIGKILL between a print and its save, the one line in between is printed again;
SIGINT and SIGTERM stop between records, so nothing repeats. (A tail of every thread
that has named more than 1,000 child threads saves every 0.2 s instead, so SIGKILL may
repeat up to that much; a clean stop still saves exactly.) If retention deleted
records the file still pointed at, the tail says how many were lost before going on.

Order: what is committed when the tail starts is shown in time order, events and receipts
interleaved by their records' `created_at` (`torpor.cli.timeorder`: each partition's
records stay in offset order, so resuming stays exact); after that, following, each
record is shown as it is read. `--no-follow` stops at the end of what is committed now
(exit 0; from the start of the topic, a thread with nothing to show is said to be
unknown on stderr); otherwise it follows until interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Final

import click

from torpor.cli.render import Renderer
from torpor.cli.settings import read_settings, settings_options
from torpor.cli.timeorder import TimeOrder
from torpor.schemas.errors import TorporError
from torpor.streams.observer import Item, Observer, Position

STATE_VERSION: Final = 1
# Beyond this many named threads (a tail of every thread), saving after each line would
# rewrite a large file per line: the position is saved every SAVE_EVERY_S instead.
EXACT_NAMES: Final = 1_000
SAVE_EVERY_S: Final = 0.2


def default_resume_file(prefix: str, thread: str | None) -> Path:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in f"{prefix}{thread or 'ALL'}")
    return Path(".torpor") / "tail" / f"{safe}.json"


def _load(path: Path, thread: str | None, deltas: bool) -> tuple[Position, Renderer] | None:
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
        if state.get("version") != STATE_VERSION or state.get("thread") != thread:
            raise ValueError(f"it is for thread {state.get('thread')!r}, version {state.get('version')}")
        return Position.from_json(state["position"]), Renderer.from_state(state["renderer"], deltas=deltas)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise click.ClickException(
            f"the resume file {path} cannot be used ({error}); "
            "delete it or pass --resume-file with another path"
        ) from None


def _save(path: Path, thread: str | None, position: Position, renderer: Renderer) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(
        json.dumps(
            {
                "version": STATE_VERSION,
                "thread": thread,
                "position": position.as_json(),
                "renderer": renderer.state(),
            },
            sort_keys=True,
        )
    )
    os.replace(temporary, path)


class _Shown:
    """Renders records and saves the position just past the last one shown.

    Records come out of `TimeOrder` in offset order per partition, so `position`, advanced
    by each record shown, is a true resume point even while later records are still held.
    `reached` is where the read itself got to (partitions read to their end included):
    saved once nothing read is held back.
    """

    def __init__(self, path: Path, thread: str | None, renderer: Renderer, position: Position) -> None:
        self.path, self.thread, self.renderer = path, thread, renderer
        self.position = position.copy()
        self.reached: Position | None = None
        self.lines = 0
        self._saved_at = time.monotonic()

    def show(self, item: Item) -> None:
        line = self.renderer.render(item)
        if line is not None:
            self.lines += 1
            click.echo(line)
            sys.stdout.flush()
        self.position.advance(item.topic, item.partition, item.offset)
        self.reached = None  # the read's position may be past records still held
        # A printed line is saved at once (small state) so a crash repeats at most it;
        # records not printed change nothing a reattached tail would show, so their
        # position is saved now and then, and at the end.
        exact = line is not None and len(self.renderer.names) <= EXACT_NAMES
        if exact or time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self.save()

    def save(self) -> None:
        """Save where the tail is: past the last record shown, or where the read reached."""
        if self.reached is not None:
            self.position = self.reached.copy()
        _save(self.path, self.thread, self.position, self.renderer)
        self._saved_at = time.monotonic()


class _Stop:
    """SIGTERM and SIGINT ask the tail to stop between records (never between a print and its save)."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._request)

    def _request(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


@click.command("tail")
@click.argument("thread", required=False)
@click.option("--receipts", is_flag=True, help="Show every receipt too (one per input).")
@click.option("--no-deltas", is_flag=True, help="Hide live model deltas (the committed turn shows the text).")
@click.option("--no-follow", is_flag=True, help="Stop at the end of what is committed now.")
@click.option("--from-end", is_flag=True, help="Without a resume file, start at the end, not the beginning.")
@click.option(
    "--resume-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where the position is saved (default .torpor/tail/<prefix><thread>.json).",
)
@click.option("--restart", is_flag=True, help="Ignore (and overwrite) the resume file.")
@settings_options
def tail(
    thread: str | None,
    receipts: bool,
    no_deltas: bool,
    no_follow: bool,
    from_end: bool,
    resume_file: Path | None,
    restart: bool,
    config_file: Path | None,
    bootstrap: str | None,
) -> None:
    """Follow THREAD's events (and its children's), or every thread's, resuming where it stopped."""
    settings = read_settings(config_file, bootstrap)
    path = resume_file or default_resume_file(settings.topics.prefix, thread)
    path.parent.mkdir(parents=True, exist_ok=True)
    loaded = None if restart else _load(path, thread, deltas=not no_deltas)
    renderer = loaded[1] if loaded else Renderer(root=thread, deltas=not no_deltas)
    stop = _Stop()
    try:
        with Observer(settings, receipts=receipts) as observer:
            position = loaded[0] if loaded else observer.start(at_end=from_end)
            # Saved before the first record, so a tail stopped at once resumes here, not at a later end.
            _save(path, thread, position, renderer)
            if loaded and (lost := observer.expired(position)) > 0:  # a fresh start lost nothing
                click.echo(
                    f"torpor tail: {lost} records expired (retention) before they were shown", err=True
                )
            shown = _Shown(path, thread, renderer, position)
            # What is committed now, in time order; then, following, each record as it comes.
            caught_up = observer.read(
                position, until_end=True, all_partitions=True, stop=lambda: stop.requested
            )
            with contextlib.closing(caught_up):  # unassign now, while the observer's consumer is open
                try:
                    order, end = TimeOrder(), None
                    for step in caught_up:
                        for item in order.add(step.item):
                            shown.show(item)
                        end = step.position
                    for item in order.drain():
                        if stop.requested:
                            break
                        shown.show(item)
                    if not order:
                        shown.reached = end  # nothing read is held back: save where the read got to
                finally:
                    shown.save()
            if not no_follow and not stop.requested:
                live = observer.read(
                    shown.position, until_end=False, all_partitions=True, stop=lambda: stop.requested
                )
                with contextlib.closing(live):
                    try:
                        for step in live:
                            shown.show(step.item)
                            shown.reached = step.position  # nothing is held: all read is shown
                            if stop.requested:
                                break
                    finally:
                        shown.save()
            if thread is not None and no_follow and not loaded and not from_end and shown.lines == 0:
                click.echo(f"torpor tail: nothing of thread {thread!r} on {settings.topics.prefix}events "
                           "(kept a day by default): no such thread, or none of its events are left",
                           err=True)
    except TorporError as error:
        raise click.ClickException(str(error)) from None
    except BrokenPipeError:  # `torpor tail | head`: the reader left; the position is saved
        sys.stderr.close()
