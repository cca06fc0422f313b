"""Records as plain JSON for the page: every dataclass field, and its class as `type`.

`plain(record)` turns a `ThreadEvent`, `Receipt`, `HistoryEntry` (or anything made of
frozen dataclasses, tuples, strings and numbers) into JSON-ready data. Bytes (image
data) become their length only: the page shows that an image was there, not the image.
Nothing here escapes for HTML: the page puts every value into the document as text
(`textContent`), never as markup.
"""

from __future__ import annotations

import dataclasses

from torpor.streams.observer import Observed, Undecodable


def plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, object] = {"type": type(value).__name__}
        for field in dataclasses.fields(value):
            out[field.name] = plain(getattr(value, field.name))
        return out
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return {"bytes": len(value)}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def item_json(item: Observed | Undecodable) -> dict[str, object]:
    """One record read by an observer, with where it was read (topic, partition, offset)."""
    where: dict[str, object] = {"topic": item.topic, "partition": item.partition, "offset": item.offset}
    if isinstance(item, Undecodable):
        return {**where, "undecodable": item.reason}
    return {**where, "record": plain(item.record)}
