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
    # By position, in the field order (named in the comments): built for every input, and a
    # call by keyword turns the 17 names into a dict and back on its way into `__init__`.
    return Receipt(
        derive_id(input.message_id, "receipt", disposition, str(facts.attempt)),  # receipt_id
        input.thread_id,  # thread_id
        input.message_id,  # input_id
        facts.partition,  # input_partition
        facts.offset,  # input_offset
        input.created_at,  # created_at
        disposition,  # disposition
        reason,  # reason
        before.head if before is not None else GENESIS_HEAD,  # history_before
        after.head if after is not None else GENESIS_HEAD,  # history_after
        shown.version if shown is not None else 0,  # thread_version
        tool_request_ids,  # tool_request_ids
        shown.config.capability if shown is not None else None,  # authority_snapshot
        turn_commit,  # turn_commit
        facts.provenance,  # provenance
        facts.attempt,  # retry_count
        RUNTIME_BUILD,  # runtime_build
    )
