"""What the checkpoint loop tells an observer about its transactions: `CheckpointObserver`.

Contract. `CheckpointLoop(..., observer=...)` calls, on the loop's own thread:

    committed(seconds)   a checkpoint committed and its overlays were applied to the
                         stores; `seconds` is how long phases 3-5 took (the checkpoint
                         markers, flush, send offsets, commit, apply)
    aborted(cause)       an open transaction was aborted and its overlays dropped;
                         `cause` is the class name of the error that made the loop abort
                         it (a short, bounded set: a label, not a message)

Only what the loop already holds is passed: an observer never reaches into the loop.
An observer must be quick and must not raise (it runs inside the commit path). The
processor's metrics (`torpor.processors.metrics`) are the one implementation;
`QuietCheckpoints` is the default that does nothing.
"""

from __future__ import annotations

from typing import Protocol


class CheckpointObserver(Protocol):
    """Told of every checkpoint's outcome (module docstring)."""

    def committed(self, seconds: float) -> None: ...

    def aborted(self, cause: str) -> None: ...


class QuietCheckpoints:
    """The observer of a loop nobody watches."""

    def committed(self, seconds: float) -> None:
        pass

    def aborted(self, cause: str) -> None:
        pass
