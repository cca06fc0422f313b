"""A Faust app reading Torpor's `receipts` and `events` with Torpor's Avro codec.

Every receipt (one per input: what the runtime did with it) and every committed thread
event becomes one JSON line in `AUDIT_FILE` (default: standard output). The receipts
topic is named through the codec registered with Faust (``torpor_receipts``); the events
topic comes ready-made from `TorporTopics`. Both read only committed records
(`torpor.faust.App`).

    export TORPOR_BOOTSTRAP=127.0.0.1:9092
    python docs/faust/audit_app.py worker --without-web --loglevel=info
"""

from __future__ import annotations

import json
import os
import sys
from typing import TextIO

import faust

from torpor.faust import CODEC_NAMES, App, TorporTopics
from torpor.schemas.records import AssistantEntry, Receipt, TextBlock, ThreadEvent
from torpor.streams.config import load_settings

settings = load_settings(os.environ, None)
app_id = f"{settings.topics.prefix}faust-audit"
app = App(app_id, settings=settings, consumer_group_instance_id=f"{app_id}-0", topic_disable_leader=True)
topics = TorporTopics.of(app)  # also registers the codecs under CODEC_NAMES
receipts = app.topic(topics.names.receipts, key_type=str, key_serializer="raw",
                     value_serializer=CODEC_NAMES["receipts"])


def _out() -> TextIO:
    path = os.environ.get("AUDIT_FILE")
    return open(path, "a") if path else sys.stdout  # closed by _write


def _write(line: dict[str, object]) -> None:
    out = _out()
    try:
        out.write(json.dumps(line, sort_keys=True) + "\n")
        out.flush()
    finally:
        if out is not sys.stdout:
            out.close()


def _said(event: ThreadEvent) -> str | None:
    """What the model said, for a committed turn; the event's own text otherwise."""
    if event.entry is not None and isinstance(event.entry.body, AssistantEntry):
        return " ".join(b.text for b in event.entry.body.content if isinstance(b, TextBlock))
    return event.text


@app.agent(receipts)
async def audit(stream: faust.StreamT[Receipt]) -> None:
    async for receipt in stream:
        _write({"topic": "receipts", "thread_id": receipt.thread_id, "input_id": receipt.input_id,
                "disposition": receipt.disposition, "provenance": receipt.provenance,
                "history_after": receipt.history_after})


@app.agent(topics.events)
async def watch(stream: faust.StreamT[ThreadEvent]) -> None:
    async for event in stream:
        if not event.ephemeral:  # live deltas are not history
            _write({"topic": "events", "thread_id": event.thread_id, "kind": event.kind,
                    "seq": event.seq, "text": _said(event)})


if __name__ == "__main__":
    app.main()
