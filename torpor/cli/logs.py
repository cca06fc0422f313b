"""Logging for the long-running commands: one line per record, with the shell's fields.

STYLE 15: the shell logs with `thread_id`, `partition`, `offset`, `message_id` and
`disposition`. Modules pass them as `extra=`; this formatter appends those present as
`key=value`, so a line can be grepped by thread or by offset.
"""

from __future__ import annotations

import logging
from typing import Final

FIELDS: Final = ("thread_id", "partition", "offset", "message_id", "disposition")


class FieldsFormatter(logging.Formatter):
    """`time level logger: message key=value ...` for the fields of `FIELDS` a record has."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{name}={getattr(record, name)}" for name in FIELDS
                         if getattr(record, name, None) is not None)
        return f"{line} {extra}" if extra else line


def configure(level: str) -> None:
    """Send every Torpor log record at `level` or above to stderr, one line each."""
    handler = logging.StreamHandler()
    handler.setFormatter(FieldsFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
