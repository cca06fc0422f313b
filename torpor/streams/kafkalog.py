"""librdkafka's log through Python logging, repeats rate-limited.

Left alone, librdkafka prints `%3|...|FAIL|...` lines straight to stderr: a command with
no broker to reach printed about 200 of them, and a running processor about 1,600 a
minute while its broker was down. Every client Torpor makes (`streams.clients`, the
observer) gets `KAFKA_LOG` as its `logger`: librdkafka's messages become records of the
`torpor.kafka` logger, at the level librdkafka gives them (errors as ERROR), handled like
any other log record of the process. `RepeatFilter` on that logger lets a message through
the first time, then at most once per `REPEAT_WINDOW_S` with how many like it it held
back; "like it" ignores digits (a timestamp, a count of milliseconds, a port).

A broker that goes away is said once, not once per client and connection: `BrokerWatch`,
ahead of `RepeatFilter`, takes librdkafka's failures to connect (`Connect to ... failed`,
`Connection setup timed out`, `N/N brokers are down`) and its `Disconnected` lines, and
says instead, once per broker address and outage,

    broker at 127.0.0.1:9092 unreachable since 21:06:02 (Connection refused); retrying

and, when it answers again, `broker at 127.0.0.1:9092 reachable again after 45s`.
librdkafka says nothing when a connection comes back (below debug level), so while an
address is down a daemon thread tries a TCP connection to it every `PROBE_EVERY_S`;
the clients themselves reconnect on their own schedule. A `Disconnected` alone (a
broker closing an idle connection, which librdkafka reopens when needed) says nothing.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

REPEAT_WINDOW_S: Final = 60.0
# Distinct messages remembered at most (the oldest forgotten first): bounds the memory
# whatever a long outage logs.
REMEMBERED: Final = 512
_DIGITS: Final = re.compile(r"\d+")


@dataclass(slots=True)
class _Seen:
    since: float
    held: int = 0


class RepeatFilter(logging.Filter):
    """Let a message through once per `window_s`, saying how many like it were held back."""

    def __init__(self, window_s: float = REPEAT_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._window = window_s
        self._clock = clock
        self._seen: OrderedDict[str, _Seen] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        shape = _DIGITS.sub("#", text)
        now = self._clock()
        seen = self._seen.get(shape)
        if seen is not None and now - seen.since < self._window:
            seen.held += 1
            return False
        held = seen.held if seen is not None else 0
        self._seen[shape] = _Seen(now)
        self._seen.move_to_end(shape)
        while len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)
        if held:
            record.msg = f"{text} (and {held} more like it in the last {self._window:g} s)"
            record.args = ()
        return True


# librdkafka's lines that say a broker cannot be reached, and where the address is.
_CONNECT_FAILED: Final = re.compile(r"Connect to (?:ipv[46]#)?(\S+?) failed|Connection setup timed out")
_DISCONNECTED: Final = re.compile(r"Disconnected|brokers are down")
# "127.0.0.1:9092/1: ..." or "GroupCoordinator: 127.0.0.1:9092: ...": the broker a line is about.
_BROKER_NAME: Final = re.compile(r"\]: (?:\w+: )?(\[?[\w.:-]+?\]?:\d+)(?:/\w+)?: ")
PROBE_EVERY_S: Final = 1.0
# A failure logged this soon after its broker came back is taken as one of the outage's,
# delivered late (librdkafka queues a client's log until the client is polled).
STALE_AFTER_S: Final = 120.0
_PROBE_TIMEOUT_S: Final = 1.0

Probe = Callable[[str], bool]


def tcp_answers(address: str) -> bool:
    """A TCP connection to `host:port` opens (the broker's listener is up)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False


class BrokerWatch(logging.Filter):
    """Turns librdkafka's connection failures into one line per outage (module docstring)."""

    def __init__(self, say: logging.Logger, probe: Probe = tcp_answers, *, start_prober: bool = True,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        super().__init__()
        self._say = say
        self._probe = probe
        self._start_prober = start_prober
        self._clock = clock
        self._wall = wall
        self._down: dict[str, float] = {}  # address: since (monotonic)
        self._back: dict[str, float] = {}  # address: when it answered again (monotonic)
        self._lock = threading.Lock()
        self._prober: threading.Thread | None = None

    @property
    def down(self) -> tuple[str, ...]:
        """The broker addresses said unreachable and not yet back."""
        with self._lock:
            return tuple(self._down)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        failed = _CONNECT_FAILED.search(text)
        if failed is None:
            # Said by the watch, or nothing worth saying; but librdkafka's hint at a wrong
            # security.protocol ("might be caused by ...") is kept.
            return _DISCONNECTED.search(text) is None or "might be caused" in text
        named = _BROKER_NAME.search(text)
        address = failed.group(1) or (named.group(1) if named else None)
        if address is None:
            return False
        return self.unreachable(address, _reason(text))

    def unreachable(self, address: str, reason: str) -> bool:
        """`address` failed to connect: say so, once, if it does not answer now.

        Returns whether librdkafka's own line should still be logged: only when the
        broker answers now and did not just come back, i.e. a failure the watch has no
        outage for (a listener that accepts connections but fails them). librdkafka
        delivers a client's log when that client is next polled, so the failures of an
        outage can arrive after the watch said the broker was back: those are dropped.
        """
        with self._lock:
            if address in self._down:
                return False
        if self._probe(address):
            with self._lock:
                back = self._back.get(address)
            return back is None or self._clock() - back > STALE_AFTER_S
        with self._lock:
            if address in self._down:
                return False
            self._down[address] = self._clock()
        since = time.strftime("%H:%M:%S", time.localtime(self._wall()))
        self._say.warning("broker at %s unreachable since %s (%s); retrying", address, since, reason)
        if self._start_prober:
            self._ensure_prober()
        return False

    def probe_once(self) -> None:
        """Try each down address once; say which answer again."""
        for address in self.down:
            if self._probe(address):
                with self._lock:
                    since = self._down.pop(address, None)
                    self._back[address] = self._clock()
                if since is not None:
                    self._say.info("broker at %s reachable again after %.0fs", address, self._clock() - since)

    def _ensure_prober(self) -> None:
        with self._lock:
            if self._prober is not None and self._prober.is_alive():
                return
            self._prober = threading.Thread(target=self._probe_while_down, name="torpor-broker-watch",
                                            daemon=True)
            self._prober.start()

    def _probe_while_down(self) -> None:
        while self.down:
            time.sleep(PROBE_EVERY_S)
            self.probe_once()


def _reason(text: str) -> str:
    """The cause librdkafka gave, without its timings: "Connection refused", "timed out"."""
    if "timed out" in text:
        return "connection setup timed out"
    cause = text.rsplit("failed: ", 1)[-1] if "failed: " in text else text
    return cause.split(" (after", 1)[0].strip() or "connection failed"


KAFKA_LOG: Final = logging.getLogger("torpor.kafka")
BROKER_WATCH: Final = BrokerWatch(logging.getLogger("torpor.kafka.broker"))
KAFKA_LOG.addFilter(BROKER_WATCH)
KAFKA_LOG.addFilter(RepeatFilter())
