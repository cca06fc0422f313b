"""librdkafka's log through Python logging, repeats rate-limited.

Left alone, librdkafka prints `%3|...|FAIL|...` lines straight to stderr: a command with
no broker to reach printed about 200 of them, and a running processor about 1,600 a
minute while its broker was down. Every client Torpor makes (`streams.clients`, the
observer) gets `KAFKA_LOG` as its `logger`: librdkafka's messages become records of the
`torpor.kafka` logger, at the level librdkafka gives them (errors as ERROR), handled like
any other log record of the process. `RepeatFilter` on that logger lets a message through
the first time, then at most once per `REPEAT_WINDOW_S` with how many like it it held
back; "like it" ignores digits (a timestamp, a count of milliseconds, a port).
"""

from __future__ import annotations

import logging
import re
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


KAFKA_LOG: Final = logging.getLogger("torpor.kafka")
KAFKA_LOG.addFilter(RepeatFilter())
