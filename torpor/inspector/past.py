"""Time travel for the page: a thread as it stood after one of its inputs.

`PastState` is what the page shows: the thread's status, history length, hash-chain head
and history entries as they were right after the input at `offset` of its partition of
`inputs`. `TimeTravel` is the function that re-folds the log to get it (`torpor replay
--thread T --at OFFSET` does the same: the processor's own `step` over the thread's
inputs up to that offset, into memory, producing nothing). The inspector does not fold:
the command line hands it that function (`torpor.cli.ui`), so the page's past is the
replay's past, byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torpor.inspector.plain import plain
from torpor.schemas.records import HistoryEntry


@dataclass(frozen=True, slots=True)
class PastState:
    thread_id: str
    offset: int
    status: str
    history_len: int
    head: str
    entries: tuple[HistoryEntry, ...]

    def as_json(self) -> dict[str, object]:
        return {"thread_id": self.thread_id, "offset": self.offset, "status": self.status,
                "history_len": self.history_len, "head": self.head,
                "entries": [plain(e) for e in self.entries]}


TimeTravel = Callable[[str, int], PastState | None]
"""`(thread_id, offset) -> PastState`, or None if the thread did not exist at that offset.
Blocking (it reads the thread's partition of `inputs` up to the offset); raises `TorporError`."""
