"""The shell's log fields, and a context that adds them to every line logged inside it.

STYLE 15: the shell logs with `thread_id`, `partition`, `offset`, `message_id`,
`request_id` and `disposition` (`FIELDS`). A call site that has them passes them as
`extra=`. Work that runs on behalf of one thread or one request without knowing it in
every function (a model call and its provider adapter, a tool's task in a connector)
runs inside `log_fields(thread_id=..., request_id=...)`: every record logged in that
context (a `contextvars` context: an asyncio task started inside inherits it) gets the
fields it does not carry itself, once the command line's handler applies `add_fields`.

Not for the fold's hot path: setting a context costs a dict per call, so `step` passes
its fields explicitly, and only on the lines it logs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Final

FIELDS: Final = ("thread_id", "partition", "offset", "message_id", "request_id", "disposition")

_CURRENT: Final[ContextVar[Mapping[str, object] | None]] = ContextVar("torpor_log_fields", default=None)


class LogFields:
    """The block of `log_fields`. A class, not a `contextlib` generator: the model stage
    enters one per completion, and the generator's machinery cost it ~5,000 instructions
    each (callgrind, bench/README.md stop 34)."""

    __slots__ = ("_fields", "_token")

    def __init__(self, fields: Mapping[str, object]) -> None:
        self._fields = fields

    def __enter__(self) -> None:
        added = {k: v for k, v in self._fields.items() if v is not None}
        current = _CURRENT.get()
        self._token = _CURRENT.set({**current, **added} if current else added)

    def __exit__(self, *_: object) -> None:
        _CURRENT.reset(self._token)


def log_fields(**fields: object) -> LogFields:
    """Add `fields` (those not None) to every record logged inside the block."""
    return LogFields(fields)


def add_fields(record: logging.LogRecord) -> bool:
    """A `logging` filter: give `record` the context's fields it lacks. Always keeps it."""
    current = _CURRENT.get()
    if current is None:
        return True
    for name, value in current.items():
        if getattr(record, name, None) is None:
            setattr(record, name, value)
    return True
