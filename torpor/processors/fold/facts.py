"""What the shell looked up before folding one input: the fold's `Facts` (pure).

The shell (`torpor.processors.step`) looks up what the fold may not: whether the message
id was seen, the verifier's verdict, how many attempts went before, where the input was
read from the log. The fold decides with these and the input alone, so a replay that
looks up the same facts folds the same transition.

`Facts` is built once per input folded. This module is compiled (torpor.native): there
the class is native and its `__init__` of plain stores builds it in ~0.05 us, against
~1 us for the `__init__` that `dataclasses` generates (Python even in a compiled module).
Run as Python, `fast_inits` replaces that `__init__` with its slot-setting one
(`torpor.processors.fold.effects` says why). It is frozen either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from torpor.schemas.frozen import fast_inits
from torpor.schemas.records import VERIFIED, ThreadConfig


@dataclass(frozen=True, slots=True, init=False)
class Facts:
    """What the shell looked up before folding an input.

    `seen`: the message id was already remembered for this thread. `provenance`: the
    verifier's verdict (`verified`, `unsigned`, `forged`, `expired`, `unbound`,
    `invalid`) and `provenance_reason` the rule that decided it, for the receipt.
    `attempt`: how many times this input was tried before (0 the first time).
    `default_config`: the config a first `UserMessage` may create an unknown thread with
    (only if its `allow_implicit_create` is true). `partition` and `offset`: where the
    input was read from the `inputs` log, for its receipt (None: not read from a log,
    or not known); the fold copies them and judges nothing by them.
    """

    seen: bool = False
    provenance: str = VERIFIED
    provenance_reason: str | None = None
    attempt: int = 0
    default_config: ThreadConfig | None = None
    partition: int | None = None
    offset: int | None = None

    def __init__(self, seen: bool = False, provenance: str = VERIFIED, provenance_reason: str | None = None,
                 attempt: int = 0, default_config: ThreadConfig | None = None, partition: int | None = None,
                 offset: int | None = None) -> None:  # compiled only: module docstring
        self.seen = seen  # type: ignore[misc]
        self.provenance = provenance  # type: ignore[misc]
        self.provenance_reason = provenance_reason  # type: ignore[misc]
        self.attempt = attempt  # type: ignore[misc]
        self.default_config = default_config  # type: ignore[misc]
        self.partition = partition  # type: ignore[misc]
        self.offset = offset  # type: ignore[misc]


# In the pure build, replaces the `__init__` written for the compiled one (module docstring).
fast_inits(__name__)
