"""Receipt construction: the one receipt every input gets (pure)."""

from __future__ import annotations

from typing import Final

from torpor.processors.fold.facts import Facts
from torpor.processors.fold.state import GENESIS_HEAD, ThreadState
from torpor.schemas.ids import derive_id
from torpor.schemas.records import Input, Receipt

RUNTIME_BUILD: Final = "torpor-fold/3"
"""Names the fold's semantics: bump it when a change would judge a replayed input differently.
/2: a creation of a deleted thread made at or before its deletion is `rejected:thread_deleted`.
/3: a deleted thread keeps its seen rows instead (any input it applied, produced again, is a
`duplicate`); no time rule, so no `rejected:thread_deleted`."""


def build_receipt(input: Input, facts: Facts, disposition: str, reason: str | None,
                  before: ThreadState | None, after: ThreadState | None,
                  tool_request_ids: tuple[str, ...] = (), turn_commit: bool = False) -> Receipt:
    """The receipt of `input`, folded from `before` to `after` with `disposition`.

    `input_partition`/`input_offset` are where the shell read the input (`facts`).
    """
    shown = after if after is not None else before
    # Every field set here, without `Receipt.__init__`: built for every input, and compiled
    # (torpor.native) each `object.__setattr__` is one C call to the generic setter, where
    # calling the class runs its `__init__` in the interpreter (and by keyword turns the 17
    # names into a dict and back). The frozen `__setattr__` is what everyone else meets.
    # (Kept out of methods: `draft._event` says why.)
    receipt: Receipt = object.__new__(Receipt)
    object.__setattr__(receipt, "receipt_id", derive_id(input.message_id, "receipt", disposition,
                                                         str(facts.attempt)))
    object.__setattr__(receipt, "thread_id", input.thread_id)
    object.__setattr__(receipt, "input_id", input.message_id)
    object.__setattr__(receipt, "input_partition", facts.partition)
    object.__setattr__(receipt, "input_offset", facts.offset)
    object.__setattr__(receipt, "created_at", input.created_at)
    object.__setattr__(receipt, "disposition", disposition)
    object.__setattr__(receipt, "reason", reason)
    object.__setattr__(receipt, "history_before", before.head if before is not None else GENESIS_HEAD)
    object.__setattr__(receipt, "history_after", after.head if after is not None else GENESIS_HEAD)
    object.__setattr__(receipt, "thread_version", shown.version if shown is not None else 0)
    object.__setattr__(receipt, "tool_request_ids", tool_request_ids)
    object.__setattr__(receipt, "authority_snapshot", shown.config.capability if shown is not None else None)
    object.__setattr__(receipt, "turn_commit", turn_commit)
    object.__setattr__(receipt, "provenance", facts.provenance)
    object.__setattr__(receipt, "retry_count", facts.attempt)
    object.__setattr__(receipt, "runtime_build", RUNTIME_BUILD)
    return receipt
