"""librdkafka's log through Python logging: repeats held back within a window, then counted."""

from __future__ import annotations

import logging
import socket

import pytest
from confluent_kafka import Producer

from torpor.streams.kafkalog import KAFKA_LOG, BrokerWatch, RepeatFilter


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


def _closed_port() -> int:
    """A port nothing listens on now: the system's pick, released at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_client_with_no_broker_logs_through_python_logging_not_stderr(
        capfd: pytest.CaptureFixture[str]) -> None:
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    # The watch says an address once per process: one no earlier test used (127.0.0.1:1 is).
    nobody = f"127.0.0.1:{_closed_port()}"
    keep = Keep()
    KAFKA_LOG.addHandler(keep)
    try:
        producer = Producer({"bootstrap.servers": nobody, "logger": KAFKA_LOG})
        for _ in range(600):  # up to a minute: the log comes with the first refused connection
            producer.poll(0.1)
            if seen:
                break
    finally:
        KAFKA_LOG.removeHandler(keep)
    # The refused connection, said once by the broker watch (a child of torpor.kafka).
    assert seen and seen[0].levelno == logging.WARNING, [r.getMessage() for r in seen]
    assert f"broker at {nobody} unreachable since" in seen[0].getMessage()
    assert "%3|" not in capfd.readouterr().err


class Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _watch(answers: list[bool]) -> tuple[BrokerWatch, Said]:
    said = Said()
    logger = logging.getLogger(f"test.watch.{id(said)}")
    logger.addHandler(said)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return BrokerWatch(logger, lambda address: answers[0], start_prober=False), said


OUTAGE = [
    "[thrd:127.0.0.1:9092/1]: 127.0.0.1:9092/1: Disconnected: connection closed by peer: receive 0 "
    "after POLLIN (after 11951ms in state UP)",
    "[thrd:127.0.0.1:9092/1]: 127.0.0.1:9092/1: Connect to ipv4#127.0.0.1:9092 failed: Connection refused "
    "(after 0ms in state CONNECT)",
    "[thrd:GroupCoordinator]: GroupCoordinator: 127.0.0.1:9092: Connect to ipv4#127.0.0.1:9092 failed: "
    "Connection refused (after 0ms in state CONNECT, 1 identical error(s) suppressed)",
    "[thrd:TxnCoordinator]: TxnCoordinator: 127.0.0.1:9092: Connection setup timed out in state CONNECT "
    "(after 30029ms in state CONNECT)",
    "[thrd:app]: 1/1 brokers are down",
]


def test_a_broker_going_away_is_said_once_and_once_when_it_is_back() -> None:
    answers = [False]
    watch, said = _watch(answers)
    for _ in range(50):  # every client, every connection, every retry
        for text in OUTAGE:
            assert not watch.filter(_record(text))
    assert len(said.lines) == 1, said.lines
    assert said.lines[0].startswith("broker at 127.0.0.1:9092 unreachable since ")
    assert said.lines[0].endswith("(Connection refused); retrying")
    watch.probe_once()
    assert len(said.lines) == 1 and watch.down == ("127.0.0.1:9092",)
    answers[0] = True
    watch.probe_once()
    assert said.lines[1].startswith("broker at 127.0.0.1:9092 reachable again after ")
    assert watch.down == ()
    # librdkafka delivers a client's log when it is next polled: the outage's failures can
    # come after the broker is back. It answers: they are dropped, nothing more is said.
    assert not watch.filter(_record(OUTAGE[2]))
    assert len(said.lines) == 2
    answers[0] = False
    assert not watch.filter(_record(OUTAGE[1]))  # away again: a new outage, said again
    assert len(said.lines) == 3 and "unreachable" in said.lines[2]


def test_a_failure_from_a_broker_that_answers_and_had_no_outage_is_logged_as_librdkafka_said() -> None:
    watch, said = _watch([True])
    assert watch.filter(_record(OUTAGE[1]))  # a listener that accepts and then fails: not an outage
    assert said.lines == [] and watch.down == ()


def test_a_lone_disconnect_says_nothing_and_other_lines_pass() -> None:
    watch, said = _watch([True])
    assert not watch.filter(_record(OUTAGE[0]))
    hint = ("[thrd:x]: 127.0.0.1:9092/bootstrap: Disconnected while requesting ApiVersion: might be "
            "caused by incorrect security.protocol configuration (connecting to a SSL listener?)")
    assert watch.filter(_record(hint))
    assert watch.filter(_record("Consumer group session timed out (in join-state steady)"))
    assert said.lines == [] and watch.down == ()
