"""`torpor replay`: re-fold the `inputs` topic and check every thread's hash chain head.

Output contract. Reads `inputs` read_committed from the beginning (all of it, one
`--thread`, or up to a cut) and folds it with the processor's own `step`, verifier and
size limit into memory; it produces nothing. A full replay compares each thread with the
live state (`--store-dir`, else the changelog) and prints one line per thread,
`thread  status  entries  head  ok|DIFF`, then the differences with their reasons; exit
code 0 when every thread matches, 1 when any differs. A cut replay (`--until-offset
P:O`, repeatable, inclusive; `--until-time ISO`, by record time) is time travel: it prints
the threads as they stood and compares nothing; `--at OFFSET` with `--thread` prints that
thread's history as it stood after the input at OFFSET of its partition. Progress
(records/s) goes to stderr; `--json` prints one JSON object instead of lines.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Final

import click

from torpor.cli.history import live_stores
from torpor.cli.settings import read_settings, settings_options
from torpor.processors.refold import refold
from torpor.processors.replay import (
    Cut,
    Mismatch,
    RateMeter,
    ThreadHead,
    compare,
    history_rows,
    thread_heads,
)
from torpor.processors.store.kv import Store
from torpor.schemas.errors import TorporError

PROGRESS_EVERY: Final = 0.5  # seconds between progress lines


def _offsets(values: tuple[str, ...]) -> dict[int, int]:
    found: dict[int, int] = {}
    for value in values:
        partition, _, offset = value.partition(":")
        if not (partition.isdigit() and offset.isdigit()):
            raise click.BadParameter(f"{value!r} is not PARTITION:OFFSET", param_hint="--until-offset")
        found[int(partition)] = int(offset)
    return found


def _time_ms(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO time", param_hint="--until-time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


class _ProgressLine:
    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._meter = RateMeter()
        self._last = -PROGRESS_EVERY
        self.count = 0

    def __call__(self, count: int, total: int) -> None:
        self.count = count
        if self._enabled and self._meter.elapsed - self._last >= PROGRESS_EVERY:
            self._last = self._meter.elapsed
            sys.stderr.write(f"\rreplay: {count}/{total} records, {self._meter.rate(count):,.0f} records/s")
            sys.stderr.flush()

    def done(self) -> str:
        if self._enabled:
            sys.stderr.write("\n")
        return (f"replayed {self.count} records in {self._meter.elapsed:.2f}s "
                f"({self._meter.rate(self.count):,.0f} records/s)")


def _head_line(head: ThreadHead, verdict: str) -> str:
    return f"{head.thread_id}  {head.status}  {head.history_len}  {head.head[:12]}  {verdict}"


@click.command("replay")
@click.option("--thread", "thread_id", default=None, help="Replay only this thread.")
@click.option("--until-offset", "until_offset", multiple=True, metavar="PARTITION:OFFSET",
              help="Stop that partition after OFFSET (repeatable).")
@click.option("--until-time", default=None, metavar="ISO", help="Stop at records written after this time.")
@click.option("--at", "at_offset", type=click.IntRange(min=0), default=None,
              help="With --thread: its history as it stood after this offset of its partition.")
@click.option("--store-dir", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="Compare with this processor's stores (default: the changelog).")
@click.option("--json", "as_json", is_flag=True, help="Machine output: one JSON object.")
@click.option("--progress/--no-progress", default=True, help="A records/s line on stderr.")
@settings_options
def replay(thread_id: str | None, until_offset: tuple[str, ...], until_time: str | None,
           at_offset: int | None, store_dir: Path | None, as_json: bool, progress: bool,
           config_file: Path | None, bootstrap: str | None) -> None:
    """Re-fold `inputs` from the start; exit 1 if any thread's head differs from the live one."""
    settings = read_settings(config_file, bootstrap)
    if at_offset is not None and thread_id is None:
        raise click.UsageError("--at needs --thread")
    cut = Cut(_offsets(until_offset), _time_ms(until_time))
    line = _ProgressLine(progress and not as_json)
    try:
        refolded = refold(settings, cut, thread_id, at_offset, progress=line)
        stores: dict[int, Store] = dict(refolded.stores)
        summary = line.done()
        replayed = thread_heads(stores, thread_id)
        if at_offset is not None and thread_id is not None:
            _print_thread(stores, thread_id, replayed.get(thread_id), as_json)
            return
        if not cut.is_full:
            _print_heads(replayed, as_json, summary)
            return
        live = thread_heads(live_stores(settings, store_dir, thread_id), thread_id)
    except TorporError as error:
        raise click.ClickException(str(error)) from None
    mismatches = compare(replayed, live)
    _print_comparison(replayed, mismatches, as_json, summary, refolded.parked)
    if mismatches:
        sys.exit(1)


def _print_thread(stores: dict[int, Store], thread_id: str, head: ThreadHead | None, as_json: bool) -> None:
    if head is None:
        raise click.ClickException(f"thread {thread_id!r} did not exist at that offset")
    rows = [row for store in stores.values() for row in history_rows(store, thread_id)]
    if as_json:
        click.echo(json.dumps({"thread_id": thread_id, "status": head.status,
                               "history_len": head.history_len, "head": head.head,
                               "entries": [r.as_json() for r in rows]}, ensure_ascii=False))
        return
    for row in rows:
        click.echo(row.line())
    click.echo(f"{thread_id}: {head.status}, {head.history_len} entries, head {head.head}", err=True)


def _print_heads(replayed: dict[str, ThreadHead], as_json: bool, summary: str) -> None:
    if as_json:
        click.echo(json.dumps({"threads": {t: {"status": h.status, "history_len": h.history_len,
                                               "head": h.head} for t, h in sorted(replayed.items())}}))
        return
    for _, head in sorted(replayed.items()):
        click.echo(_head_line(head, "as of the cut"))
    click.echo(summary, err=True)


def _print_comparison(replayed: dict[str, ThreadHead], mismatches: list[Mismatch], as_json: bool,
                      summary: str, parked: int) -> None:
    differing = {m.thread_id: m for m in mismatches}
    if as_json:
        click.echo(json.dumps({
            "threads": len(replayed), "parked_inputs": parked, "match": not mismatches,
            "mismatches": [{"thread_id": m.thread_id, "reason": m.reason} for m in mismatches],
        }))
        return
    for thread_id, head in sorted(replayed.items()):
        click.echo(_head_line(head, "DIFF" if thread_id in differing else "ok"))
    for mismatch in mismatches:
        click.echo(f"DIFF {mismatch.thread_id}: {mismatch.reason}")
    click.echo(f"{summary}; {len(replayed)} threads, {len(mismatches)} differ, "
               f"{parked} inputs parked unfolded", err=True)
