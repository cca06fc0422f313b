"""How a thread's children are made: their ids, configs and inherited context (pure)."""

from __future__ import annotations

import dataclasses
from typing import Final

from torpor.processors.fold.state import ThreadState
from torpor.schemas.records import ParentLink, ThreadConfig

CHILD: Final = "child"
EVENT: Final = "event"
COMPACTION: Final = "compaction"

TERMINAL_REPORTS: Final = frozenset({"closed", "failed", "stopped", "summary"})


def child_config(state: ThreadState, kind: str, spawn_call_id: str) -> ThreadConfig:
    """The config of a child of `state` spawned by `spawn_call_id`.

    It derives from the parent's: same tools, capability, budgets and current model (so
    the child inherits the parent's authority, never more), plus the link back. A child
    is never created implicitly.
    """
    parent = state.config.parent
    link = ParentLink(parent_thread_id=state.thread_id,
                      root_thread_id=parent.root_thread_id if parent else state.thread_id,
                      spawn_call_id=spawn_call_id, kind=kind,
                      depth=(parent.depth if parent else 0) + 1)
    return dataclasses.replace(state.config, model=state.model, parent=link, allow_implicit_create=False)


def safe_point(state: ThreadState) -> int:
    """The history length a child may inherit: never cutting a turn whose calls are pending."""
    if state.pending_calls and state.pending_turn_seq is not None:
        return state.pending_turn_seq
    return state.history_len


def is_root(state: ThreadState) -> bool:
    return state.config.parent is None
