"""Fault injection: kill (or freeze) this process at a named point of the checkpoint loop.

Contract. `point(name)` is called by the loop and the restore at the points in `POINTS`.
When `TORPOR_FAULT` is unset (production), `point` returns at once: the spec is parsed
once at import and `point` only tests a module global. When set, it is one of

- `NAME:N`            SIGKILL this process the N-th time point NAME is passed (N >= 1);
- `NAME:N:stop`       SIGSTOP this process there instead (a zombie: a harness SIGCONTs it);
- `random:SEED:RATE`  at every point passed, SIGKILL with probability RATE (0 < RATE <= 1),
                      drawn from `random.Random(SEED)`, so a run is repeatable given the
                      same sequence of points.

Before acting it writes one line `fault: <action> at <point> (pass N)` to stderr and
flushes it, so a harness can tell from the log which point fired. A malformed spec or an
unknown point name raises `FaultSpecError` (a `ConfigError`) naming the variable and the
valid forms: a typo must not silently run without the fault it asked for.

This module is for tests and soak runs only; it has no other effect.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from dataclasses import dataclass, field
from typing import Final

from torpor.schemas.errors import ConfigError

ENV: Final = "TORPOR_FAULT"

POINTS: Final[tuple[str, ...]] = (
    "before_begin",                # a checkpoint is due to open: nothing of it exists yet
    "mid_transaction",             # some records of the checkpoint are produced, not committed
    "before_commit",               # offsets sent to the transaction, commit_transaction not called
    "after_commit_before_store",   # committed on Kafka, RocksDB not written: the store lags
    "mid_store_write",             # one partition's batch written, the checkpoint's others not
    "during_restore",              # some restored changelog records applied, restore unfinished
    "on_revoke",                   # partitions are being revoked, the open checkpoint not settled
)


class FaultSpecError(ConfigError):
    """TORPOR_FAULT does not parse: the message shows the valid forms."""


@dataclass(slots=True)
class _Plan:
    """The armed fault: what to do, where, and the passes counted so far."""

    target: str | None  # None: random mode, any point
    nth: int
    stop: bool
    rng: random.Random | None = None
    rate: float = 0.0
    passes: dict[str, int] = field(default_factory=dict)

    def passed(self, name: str) -> None:
        count = self.passes[name] = self.passes.get(name, 0) + 1
        if self.rng is not None:
            if self.rng.random() < self.rate:
                _act(name, count, stop=False)
        elif name == self.target and count == self.nth:
            _act(name, count, stop=self.stop)


def _act(name: str, count: int, *, stop: bool) -> None:
    action = "SIGSTOP" if stop else "SIGKILL"
    print(f"fault: {action} at {name} (pass {count})", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSTOP if stop else signal.SIGKILL)


def parse(spec: str | None) -> _Plan | None:
    """The plan `spec` describes (None for no fault). Raises FaultSpecError."""
    if spec is None or not spec.strip():
        return None
    forms = (f"{ENV} must be NAME:N, NAME:N:stop or random:SEED:RATE with NAME one of "
             f"{', '.join(POINTS)}; got {spec!r}")
    parts = spec.strip().split(":")
    try:
        if parts[0] == "random" and len(parts) == 3:
            rate = float(parts[2])
            if not 0 < rate <= 1:
                raise ValueError(rate)
            return _Plan(None, 0, False, rng=random.Random(int(parts[1])), rate=rate)
        if parts[0] in POINTS and len(parts) in (2, 3):
            nth = int(parts[1])
            if nth < 1 or (len(parts) == 3 and parts[2] != "stop"):
                raise ValueError(spec)
            return _Plan(parts[0], nth, len(parts) == 3)
    except ValueError:
        raise FaultSpecError(forms) from None
    raise FaultSpecError(forms)


_PLAN: Final = parse(os.environ.get(ENV))


def point(name: str) -> None:
    """Pass fault point `name` (one of POINTS): a no-op unless TORPOR_FAULT arms it."""
    if _PLAN is not None:
        if name not in POINTS:
            raise FaultSpecError(f"unknown fault point {name!r}; known: {', '.join(POINTS)}")
        _PLAN.passed(name)
