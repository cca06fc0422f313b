"""The log formats of the long-running commands, without a broker: a JSON line per record
with the shell's fields (explicit ones win over the context's), and announcements that
are JSON too in that format, whatever the level."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import warnings
from collections.abc import Iterator

import pytest

from torpor.cli import logs
from torpor.streams.logfields import add_fields, log_fields


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level, hook = root.handlers[:], root.level, threading.excepthook
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    threading.excepthook = hook
    logging.captureWarnings(False)
    logs.configure("info", "text")
    root.handlers[:] = handlers


def _lines(err: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in err.splitlines()]


def test_json_lines_carry_the_fields_of_the_record_and_of_its_context(
        restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("warning", "json")
    log = logging.getLogger("torpor.test")
    log.warning("plain")
    with log_fields(thread_id="t-1", request_id="rq-1"):
        log.warning("in context", extra={"partition": 2, "offset": 7})
        log.warning("explicit wins", extra={"thread_id": "t-2"})

        async def in_a_task() -> None:  # a task started inside inherits the context
            log.warning("from a task")

        async def start() -> None:
            await asyncio.get_running_loop().create_task(in_a_task())

        asyncio.run(start())
    log.info("below the level")
    logs.announce("metrics on http://x/metrics")  # INFO, shown all the same
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("careful", UserWarning, stacklevel=1)
    lines = _lines(capsys.readouterr().err)
    by_message = {str(line["message"]).split("\n")[0]: line for line in lines}
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    assert str(by_message["plain"]["time"]).endswith("Z") and by_message["plain"]["level"] == "warning"
    assert "thread_id" not in by_message["plain"]
    context = by_message["in context"]
    assert (context["thread_id"], context["request_id"], context["partition"], context["offset"]) == \
        ("t-1", "rq-1", 2, 7)
    assert by_message["explicit wins"]["thread_id"] == "t-2"
    assert by_message["from a task"]["request_id"] == "rq-1"
    assert "below the level" not in by_message
    assert by_message["metrics on http://x/metrics"]["logger"] == logs.ANNOUNCER
    assert "ValueError: boom" in str(by_message["failed"]["exception"])
    assert any("careful" in str(line["message"]) for line in lines)


def test_a_hostile_message_stays_one_line(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", "json")
    logging.getLogger("torpor.test").info('line one\n{"level": "forged"}\r\n', extra={"offset": object()})
    (line,) = _lines(capsys.readouterr().err)
    assert line["level"] == "info" and line["message"] == 'line one\n{"level": "forged"}\r\n'
    assert isinstance(line["offset"], str)


def test_the_text_format_is_unchanged(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", "text")
    with log_fields(request_id="rq-9"):
        logging.getLogger("torpor.test").info("hello", extra={"partition": 1})
    logs.announce("started")
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith("INFO torpor.test: hello partition=1 request_id=rq-9")
    assert err[1] == "started"


def test_log_fields_nest_skip_none_and_leave_the_outer_context_after_an_error() -> None:
    record = logging.LogRecord("torpor.test", logging.INFO, __file__, 1, "m", None, None)

    def fields() -> dict[str, object]:
        seen = logging.LogRecord("torpor.test", logging.INFO, __file__, 1, "m", None, None)
        add_fields(seen)
        return {k: getattr(seen, k) for k in ("thread_id", "request_id") if hasattr(seen, k)}

    assert fields() == {}
    with log_fields(thread_id="t-1", request_id=None):
        assert fields() == {"thread_id": "t-1"}
        with pytest.raises(RuntimeError), log_fields(request_id="rq-1"):
            assert fields() == {"thread_id": "t-1", "request_id": "rq-1"}
            raise RuntimeError("inside")
        assert fields() == {"thread_id": "t-1"}
    assert fields() == {} and add_fields(record) and not hasattr(record, "thread_id")
