"""librdkafka's log through Python logging: repeats held back within a window, then counted."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import Producer

from torpor.streams.kafkalog import KAFKA_LOG, RepeatFilter


def _record(text: str) -> logging.LogRecord:
    return logging.LogRecord("torpor.kafka", logging.ERROR, __file__, 1, "%s [%s] %s",
                             ("FAIL", "rdkafka#producer-1", text), None)


def test_a_repeated_message_passes_once_a_window_with_the_count_it_held_back() -> None:
    now = [0.0]
    repeats = RepeatFilter(window_s=60.0, clock=lambda: now[0])
    first = _record("Connect to ipv4#127.0.0.1:9092 failed (after 0ms in state CONNECT)")
    assert repeats.filter(first) and "more like it" not in first.getMessage()
    for ms in range(1, 40):  # only the digits differ: the same message
        now[0] += 1.0
        text = f"Connect to ipv4#127.0.0.1:9092 failed (after {ms}ms in state CONNECT)"
        assert not repeats.filter(_record(text))
    assert repeats.filter(_record("another message"))  # a different one passes at once
    now[0] = 61.0
    later = _record("Connect to ipv4#127.0.0.1:9092 failed (after 5ms in state CONNECT)")
    assert repeats.filter(later) and "(and 39 more like it in the last 60 s)" in later.getMessage()


def test_a_client_with_no_broker_logs_through_python_logging_not_stderr(
        capfd: pytest.CaptureFixture[str]) -> None:
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    keep = Keep()
    KAFKA_LOG.addHandler(keep)
    try:
        producer = Producer({"bootstrap.servers": "127.0.0.1:1", "logger": KAFKA_LOG})
        for _ in range(600):  # up to a minute: the log comes with the first refused connection
            producer.poll(0.1)
            if seen:
                break
    finally:
        KAFKA_LOG.removeHandler(keep)
    assert seen and seen[0].levelno == logging.ERROR and "127.0.0.1:1" in seen[0].getMessage()
    assert "%3|" not in capfd.readouterr().err
