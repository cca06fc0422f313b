"""Coalescing a completion's live deltas into few events (the model stage's step 2).

Contract. `Deltas` buffers the text deltas of one attempt. The buffer is published as one
event (its texts joined, in order, labelled by the index of its first delta in the
attempt) when `StageConfig.delta_window_s` has passed since its first delta, or at
`flush()` (the end of the attempt, however it ends). A window of 0 publishes every delta
as it comes. An observer that concatenates the events' texts sees exactly the provider's
text, nothing lost or repeated.

Why one `DeltaWindows` per stage: the window only matters while a provider goes quiet
mid-stream, and most attempts end well within it (a scripted model's whole stream takes
microseconds; a hosted model's chunks come every few ms). A timer per attempt cost each
completion a `TimerHandle` made, pushed on the loop's heap, cancelled and popped again;
instead the buffers waiting on their window are kept in the order their windows end
(the window is the same for all, so that is the order they started), and one timer, armed
for the earliest, publishes every buffer whose window has passed and re-arms for the next.
A buffer flushed at the end of its attempt just leaves the order; the timer, if it was
armed for it, finds nothing due and re-arms or stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


class DeltaWindows:
    """The buffers of one stage whose window is running, and the one timer that ends them.

    Used from the stage's event loop only (each stage runs on one loop)."""

    __slots__ = ("_armed_for", "_loop", "_timer", "_waiting", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        # Buffers with text, by when their window ends; insertion order is that order.
        self._waiting: dict[Deltas, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = 0.0

    def opened(self, deltas: Deltas) -> None:
        """`deltas` buffered its first text: its window starts now."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # A stage lives on one loop; one run again on another (tests: one asyncio.run
            # after another) must not wait on a timer of a loop that is gone.
            self._loop, self._timer = loop, None
        due = loop.time() + self.window_s
        self._waiting[deltas] = due
        if self._timer is None:
            self._arm(loop, due)

    def closed(self, deltas: Deltas) -> None:
        """`deltas` was published (or emptied): it no longer waits."""
        self._waiting.pop(deltas, None)

    def _arm(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        self._armed_for = due
        self._timer = loop.call_at(due, self._fire)

    def _fire(self) -> None:
        self._timer = None
        # asyncio runs a timer up to its clock's resolution early: what was due at the
        # time armed for is due now, whatever `loop.time()` says.
        now = self._armed_for
        while self._waiting:
            deltas = next(iter(self._waiting))
            due = self._waiting[deltas]
            if due > now:
                assert self._loop is not None
                self._arm(self._loop, due)
                return
            del self._waiting[deltas]
            try:
                deltas.flush()
            except Exception:  # one sink failure must not strand the other buffers
                log.exception("publishing live deltas failed")


class Deltas:
    """The deltas of one attempt not yet published (see the module docstring)."""

    __slots__ = ("_first", "_publish", "_texts", "_windows")

    def __init__(self, publish: Callable[[int, str], None], windows: DeltaWindows) -> None:
        self._publish = publish  # (index of the first delta, joined text)
        self._windows = windows
        self._texts: list[str] = []
        self._first = 0  # index in this attempt of the first buffered delta

    def add(self, text: str) -> None:
        texts = self._texts
        texts.append(text)
        if len(texts) == 1:
            if self._windows.window_s > 0:
                self._windows.opened(self)
            else:
                self.flush()

    def flush(self) -> None:
        texts = self._texts
        if texts:
            self._windows.closed(self)
            self._texts = []
            first, self._first = self._first, self._first + len(texts)
            self._publish(first, "".join(texts))
