"""The feed: one background reader that keeps the `ThreadIndex` up to date.

Contract. `Feed(settings, index).start()` starts a daemon thread that reads `events` and
`receipts` (read_committed) from the first retained record of every partition to the
end of what is committed now (then `caught_up` is set), and then follows them, folding
each record into the index once, in offset order per partition. `stop()` asks it to end
between polls and waits for it. An undecodable record is counted (`undecodable`), never
fatal. An error (the topics do not exist yet, the broker is away) is shown in `error`
and the read is tried again after `RETRY_SECONDS` from the position it had reached, so
nothing is folded twice and the list catches up once the cause is gone.
"""

from __future__ import annotations

import logging
import threading
from typing import Final

from torpor.inspector.index import ThreadIndex
from torpor.streams.config import Settings
from torpor.streams.observer import Observed, Observer, Position

LOG = logging.getLogger(__name__)
JOIN_SECONDS: Final = 10.0
RETRY_SECONDS: Final = 2.0


class Feed:
    def __init__(self, settings: Settings, index: ThreadIndex) -> None:
        self._settings = settings
        self._index = index
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torpor-ui-feed", daemon=True)
        self._position: Position | None = None
        self.caught_up = threading.Event()
        self.undecodable = 0
        self.error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(JOIN_SECONDS)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._read()
            except Exception as error:  # shown on the page; tried again from where it was
                LOG.warning("the inspector's feed failed, retrying in %.0f s: %s", RETRY_SECONDS, error)
                self.error = f"{type(error).__name__}: {error}"
                self._stop.wait(RETRY_SECONDS)

    def _read(self) -> None:
        with Observer(self._settings, receipts=True) as observer:
            if self._position is None:
                self._position = observer.start(at_end=False)
            self.error = None
            # What is there now (unless that was read before a retry), then what comes.
            for until_end in (False,) if self.caught_up.is_set() else (True, False):
                for step in observer.read(self._position, until_end=until_end, all_partitions=True,
                                          stop=self._stop.is_set):
                    if isinstance(step.item, Observed):
                        self._index.observe(step.item.record)
                    else:
                        self.undecodable += 1
                    self._position = step.position
                self.caught_up.set()
