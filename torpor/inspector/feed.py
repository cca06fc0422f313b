"""The feed: one background reader that keeps the `ThreadIndex` up to date.

Contract. `Feed(settings, index).start()` starts a daemon thread that reads `events` and
`receipts` (read_committed) from the first retained record of every partition to the
end of what is committed now (then `caught_up` is set), and then follows them, folding
each record into the index once, in offset order per partition. `stop()` asks it to end
between polls and waits for it. An undecodable record is counted (`undecodable`), never
fatal; any other error ends the feed, and `error` says what (the page shows it).
"""

from __future__ import annotations

import logging
import threading

from torpor.inspector.index import ThreadIndex
from torpor.streams.config import Settings
from torpor.streams.observer import Observed, Observer

LOG = logging.getLogger(__name__)
JOIN_SECONDS = 10.0


class Feed:
    def __init__(self, settings: Settings, index: ThreadIndex) -> None:
        self._settings = settings
        self._index = index
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torpor-ui-feed", daemon=True)
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
        try:
            with Observer(self._settings, receipts=True) as observer:
                position = observer.start(at_end=False)
                for until_end in (True, False):  # what is there now, then what comes
                    for step in observer.read(position, until_end=until_end, all_partitions=True,
                                              stop=self._stop.is_set):
                        position = step.position
                        if isinstance(step.item, Observed):
                            self._index.observe(step.item.record)
                        else:
                            self.undecodable += 1
                    self.caught_up.set()
        except Exception as error:  # the page says the list stopped moving, and why
            LOG.exception("the inspector's feed stopped")
            self.error = f"{type(error).__name__}: {error}"
