"""`torpor history THREAD`: a thread's stored history, one line per entry.

Output contract: one line per entry, `seq  kind  head  content` (head: the first 12 hex
digits of the hash-chain head after the entry; content: one line, cut at 60 characters),
or with `--json` one JSON object with the thread's state heads and every entry. Read from
a processor's `--store-dir` (stop the processor first: RocksDB allows one writer) or, with
`--from-changelog`, from the compacted changelog (read_committed) into memory. Exit codes:
0 when the thread was found, 1 when it was not (or the configuration is wrong).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Final

import click

from torpor.cli.settings import read_settings, settings_options
from torpor.processors.replay import (
    history_rows,
    open_stores,
    partitions_of,
    restore_scratch,
    thread_head,
)
from torpor.processors.store.kv import Store
from torpor.schemas.errors import TorporError
from torpor.streams.clients import make_consumer
from torpor.streams.config import Settings
from torpor.streams.deadline import Deadline
from torpor.streams.partitioner import partition_for
from torpor.streams.topics import TopicNames

RESTORE_SECONDS: Final = 120.0


def live_stores(settings: Settings, store_dir: Path | None, thread_id: str | None) -> dict[int, Store]:
    """The live stores: the RocksDB ones under `store_dir`, else the changelog read into memory.

    From the changelog with `thread_id`, only that thread's partition is read.
    """
    if store_dir is not None:
        return dict(open_stores(store_dir))
    changelog = TopicNames.for_prefix(settings.topics.prefix).changelog
    consumer = make_consumer(settings, f"torpor-history-{uuid.uuid4().hex[:8]}")
    try:
        partitions = partitions_of(consumer, changelog)
        if thread_id is not None:
            partitions = [partition_for(thread_id.encode("utf-8"), len(partitions))]
        return dict(restore_scratch(consumer, changelog, Deadline.after(RESTORE_SECONDS), partitions))
    finally:
        consumer.close()


@click.command("history")
@click.argument("thread")
@click.option("--store-dir", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="A processor's store directory (its partition-N RocksDB stores).")
@click.option("--from-changelog", is_flag=True, help="Read the compacted changelog topic instead.")
@click.option("--json", "as_json", is_flag=True, help="Machine output: one JSON object.")
@settings_options
def history(thread: str, store_dir: Path | None, from_changelog: bool, as_json: bool,
            config_file: Path | None, bootstrap: str | None) -> None:
    """Print THREAD's history (seq, kind, hash, content) from a store or from the changelog."""
    if (store_dir is None) == (not from_changelog):
        raise click.UsageError("give exactly one of --store-dir DIR and --from-changelog")
    settings = read_settings(config_file, bootstrap)
    try:
        stores = live_stores(settings, store_dir, thread)
    except TorporError as error:
        raise click.ClickException(str(error)) from None
    for store in stores.values():
        head = thread_head(store, thread)
        if head is not None:
            rows = history_rows(store, thread)
            break
    else:
        raise click.ClickException(f"no thread {thread!r} in the live store")
    if as_json:
        click.echo(json.dumps({"thread_id": thread, "status": head.status, "history_len": head.history_len,
                               "head": head.head, "chained": head.chained,
                               "entries": [r.as_json() for r in rows]}, ensure_ascii=False))
        return
    for row in rows:
        click.echo(row.line())
    click.echo(f"{thread}: {head.status}, {head.history_len} entries, head {head.head}", err=True)
