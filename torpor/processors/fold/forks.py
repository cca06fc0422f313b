"""Forks: a new root thread whose history is another thread's up to an entry (pure).

An operator asks for a fork with a `Control(command="fork", new_thread_id, at_seq, model)`
on the *source* thread. The two threads may live on different partitions, and the fold of
one partition never reads another's state, so a fork takes two inputs, as a child does:

1. On the source (`on_fork`, a row of the `Control` handler): the guards (an operator
   asked, the new id is a root thread id other than the source's, `at_seq` names one of
   the source's entries), then a `ForkThread` effect and a `fork_requested` event. The
   source's state does not change. The shell reads the source's entries `0..at_seq`
   from its committed rows and produces the fork's `CreateThread` (source `processor`,
   signed with the processor's key, `fork` set) to the new thread's partition.
2. On the new thread (`fork_problem`, then `on_create_fork`, from `_fold_absent`): the
   creation is checked (a root config, from the processor, entries `0..at_seq` in
   order), each entry is appended exactly as it was (same seq, time, input id and body,
   so the fork's hash head after them equals the source's at `at_seq`) and narrated by
   an `inherited` event. Calls the kept entries leave open (their results came later in
   the source) are answered with `FORKED_BEFORE_RESULT`, never run again. The fork then
   owes the model a turn if its last entry is input the model has not answered (user
   text, a tool result, an event): "then continues".

If the new id names a thread that exists, its `CreateThread` is refused there with
`rejected:thread_exists` (the source's fold cannot know: another partition's). What the
fork does not inherit: pending calls, subscriptions, deferred inputs, approvals,
children, the parent link (a fork is a root thread). It inherits the source's config
(tools, capability, budgets) and current model unless the control names another.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from torpor.processors.fold.authority import FORK_COMMAND, Role, role_of
from torpor.processors.fold.draft import PROCESSOR_SOURCE, Draft, text
from torpor.processors.fold.pending import body_of
from torpor.processors.fold.state import ThreadState
from torpor.schemas.ids import PREFIX as DERIVED_PREFIX
from torpor.schemas.ids import id_problem
from torpor.schemas.records import (
    APPLIED,
    AssistantEntry,
    Control,
    CreateThread,
    EventEntry,
    ForkOrigin,
    ThreadConfig,
    ToolResultEntry,
    UserEntry,
    rejected,
)

FORK: Final = FORK_COMMAND
FORKED_BEFORE_RESULT: Final = ("This call was made before the thread was forked; its result stays in the "
                               "thread it was forked from and is not part of this one.")
# The entries after which the model owes an answer: input it has not answered yet.
UNANSWERED: Final = (UserEntry, ToolResultEntry, EventEntry)


def on_fork(draft: Draft) -> str:
    """The source's side: check the request, then ask the shell to create the fork."""
    body = body_of(draft, Control)
    state = draft.state
    source = draft.current.source
    if role_of(source) is not Role.OPERATOR:
        draft.reason = f"a fork is an operator's command, not {source[:80]!r}'s"
        return rejected("fork_not_operator")
    new_id = body.new_thread_id
    if not new_id:
        draft.reason = "a fork needs new_thread_id: the id of the thread to create"
        return rejected("fork_id_missing")
    problem = id_problem(new_id)
    if problem is None and new_id.startswith(DERIVED_PREFIX):
        problem = f"ids starting with {DERIVED_PREFIX} are derived: only the processor's children have one"
    if problem is None and new_id == state.thread_id:
        problem = "it is the id of the thread being forked"
    if problem is not None:
        draft.reason = f"new thread id {new_id[:80]!r}: {problem}"
        return rejected("invalid_fork_id")
    at_seq = body.at_seq
    if at_seq is None:
        draft.reason = "a fork needs at_seq: the last entry of this thread's history to keep"
        return rejected("fork_seq_missing")
    if not 0 <= at_seq < state.history_len:
        draft.reason = (f"at_seq {at_seq} is not an entry of this thread: it has {state.history_len} "
                        f"entries" + (f" (0 to {state.history_len - 1})" if state.history_len else ""))
        return rejected("fork_seq_out_of_range")
    if body.model is not None and not body.model.strip():
        draft.reason = "the fork's model is empty: leave it out to keep this thread's"
        return rejected("model_missing")
    config = fork_config(state, body.model)
    origin = ForkOrigin(source_thread_id=state.thread_id, at_seq=at_seq, control_id=draft.current.message_id,
                        requested_by=source)
    draft.fork(new_id, config, origin)
    draft.emit("fork_requested", data={"new_thread_id": new_id, "at_seq": at_seq, "model": config.model})
    return APPLIED


def fork_config(state: ThreadState, model: str | None) -> ThreadConfig:
    """The fork's config: the source's (tools, capability, budgets), its current model or
    `model`, and no parent link (a fork is a root thread: it reports to nobody)."""
    return dataclasses.replace(state.config, model=model or state.model, parent=None)


def fork_problem(body: CreateThread, source: str) -> str | None:
    """Why a fork's `CreateThread` cannot be folded, or None (module docstring, step 2)."""
    origin = body.fork
    assert origin is not None
    if source != PROCESSOR_SOURCE:
        return (f"only the processor creates a fork (from an operator's fork control), not "
                f"{source[:80]!r}")
    if body.config.parent is not None:
        return "a fork is a root thread: it has no parent link"
    if body.initial:
        return "a fork starts from its inherited entries alone: it has no initial input"
    seqs = [entry.seq for entry in body.inherited]
    if origin.at_seq < 0 or seqs != list(range(origin.at_seq + 1)):
        return (f"a fork's inherited entries are the source's entries 0 to {origin.at_seq}, in order "
                f"(got {len(seqs)} entries)")
    return None


def on_create_fork(draft: Draft) -> str:
    """The fork's side: its history is the source's entries as they were (module docstring)."""
    body = body_of(draft, CreateThread)
    calls: dict[str, str] = {}
    answered: set[str] = set()
    for old in body.inherited:
        entry = draft.append(old.body, input_id=old.input_id, created_at=old.created_at)
        if isinstance(old.body, AssistantEntry):
            calls.update({c.call_id: c.name for c in old.body.tool_calls})
        if isinstance(old.body, ToolResultEntry):
            answered.add(old.body.call_id)
        draft.emit("inherited", entry)
    open_calls = [(call_id, name) for call_id, name in calls.items() if call_id not in answered]
    for call_id, name in open_calls:
        entry = draft.append(ToolResultEntry(call_id=call_id, name=name, ok=False,
                                             content=text(FORKED_BEFORE_RESULT), origin="builtin"))
        draft.emit("tool_result", entry)
    last = body.inherited[-1].body if body.inherited else None
    draft.replace(owes_turn=bool(open_calls) or isinstance(last, UNANSWERED))
    return APPLIED
