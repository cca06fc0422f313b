"""Logging for the long-running commands: one line per record, with the shell's fields.

STYLE 15: the shell logs with `thread_id`, `partition`, `offset`, `message_id`,
`request_id` and `disposition` (`torpor.streams.logfields.FIELDS`). Modules pass them as
`extra=`, or log inside `log_fields(...)`; the handler `configure` installs fills in the
context's. Two formats (`--log-format`, or `TORPOR_LOG_FORMAT`):

- `text` (default): `time level logger: message key=value ...`, greppable by thread or offset;
- `json`: one JSON object per line: `time` (UTC, ISO 8601, ms), `level`, `logger`,
  `message`, the fields present, and `exception` (the traceback) when there is one. In
  this mode what a command would otherwise print to stderr itself (`announce`: where
  /metrics listens, started, stopped, `fatal:`), Python warnings and uncaught exceptions
  in threads are JSON lines too, so a log shipper can parse every line of stderr.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import threading
from enum import StrEnum
from typing import Final

import click

from torpor.streams.logfields import FIELDS, add_fields

ANNOUNCER: Final = "torpor.cli"


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


LOG_FORMAT_OPTION: Final = click.option(
    "--log-format", type=click.Choice([f.value for f in LogFormat]), default=LogFormat.TEXT.value,
    show_default=True, envvar="TORPOR_LOG_FORMAT",
    help="text: one readable line per record; json: one JSON object per line (time, level, logger, "
         "message, thread_id, partition, offset, request_id...). Or TORPOR_LOG_FORMAT.")
"""`--log-format text|json` for a long-running command."""


class FieldsFormatter(logging.Formatter):
    """`time level logger: message key=value ...` for the fields of `FIELDS` a record has."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{name}={getattr(record, name)}" for name in FIELDS
                         if getattr(record, name, None) is not None)
        return f"{line} {extra}" if extra else line


class JsonFormatter(logging.Formatter):
    """One JSON object per record (module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        line: dict[str, object] = {
            "time": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value if isinstance(value, int | float | str | bool | list) else str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


_handler: logging.Handler | None = None
_format = LogFormat.TEXT


def configure(level: str, log_format: str = LogFormat.TEXT) -> None:
    """Send every Torpor log record at `level` or above to stderr, one line each, in `log_format`."""
    global _handler, _format
    _format = LogFormat(log_format)
    handler = logging.StreamHandler()
    handler.addFilter(add_fields)
    if _format is LogFormat.JSON:
        handler.setFormatter(JsonFormatter())
        logging.captureWarnings(True)
        threading.excepthook = _log_thread_exception
    else:
        handler.setFormatter(FieldsFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    _handler = handler


def is_json() -> bool:
    return _format is LogFormat.JSON


def announce(message: str, level: int = logging.INFO) -> None:
    """Tell the person at the terminal: a plain line on stderr, or, in the json format, a
    JSON line from the `torpor.cli` logger whatever the log level (a command's own news
    is never filtered out)."""
    if _handler is None or _format is LogFormat.TEXT:
        click.echo(message, err=True)
        return
    record = logging.getLogger(ANNOUNCER).makeRecord(ANNOUNCER, level, "", 0, message, (), None)
    _handler.handle(record)
    _handler.flush()


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    exc_info = (args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback)
    logging.getLogger(ANNOUNCER).error("uncaught exception in thread %s", name, exc_info=exc_info)
    sys.stderr.flush()
