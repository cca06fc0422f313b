"""Receipt construction: the one receipt every input gets (pure)."""

from __future__ import annotations

from typing import Final

from torpor.processors.fold.state import GENESIS_HEAD, Facts, ThreadState
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

    `input_partition`/`input_offset` are left None: only the shell knows them.
    """
    shown = after if after is not None else before
    return Receipt(
        receipt_id=derive_id(input.message_id, "receipt", disposition, str(facts.attempt)),
        thread_id=input.thread_id,
        input_id=input.message_id,
        input_partition=None,
        input_offset=None,
        created_at=input.created_at,
        disposition=disposition,
        reason=reason,
        history_before=before.head if before is not None else GENESIS_HEAD,
        history_after=after.head if after is not None else GENESIS_HEAD,
        thread_version=shown.version if shown is not None else 0,
        tool_request_ids=tool_request_ids,
        authority_snapshot=shown.config.capability if shown is not None else None,
        turn_commit=turn_commit,
        provenance=facts.provenance,
        retry_count=facts.attempt,
        runtime_build=RUNTIME_BUILD,
    )
