"""The ids a provider's tool calls keep or get: the model stage's check of them (pure).

The model stage (`torpor.processors.models.stage`) does not trust a provider to name its
calls well; before a finished turn becomes a `Completion` input, `carried_calls` gives
every call an id the fold can bind a result to and every provider can be sent back.
`held_call_ids` is what the thread already uses, which a new call may not take.

`fold.history.note_call_ids` records the ids a history mentions; the model stage's
history cache keeps them per thread as entries are appended, so `held_call_ids` need not
read the history at every completion with calls (it does when the cache does not hold the
thread).

Compiled (torpor.native): as Python, reading the history here was ~1.5% of a local
completion's CPU.
"""

from __future__ import annotations

import re
from collections.abc import Container, Mapping, Sequence
from typing import Final

from torpor.processors.fold.history import note_call_ids
from torpor.processors.fold.state import ThreadState
from torpor.schemas.ids import derive_id
from torpor.schemas.records import HistoryEntry, ToolCall

CARRIED_CALL_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,40}")
"""A provider's call id kept as it came: what every provider adapter can send back in the
thread's history, whichever provider the thread is moved to later (Anthropic and Bedrock
take `[a-zA-Z0-9_-]+`, Bedrock up to 64 characters, OpenAI up to 40), and a wire id.
`derive_id`'s ids (`tp_` and 32 hex digits) are of it."""


def held_call_ids(state: ThreadState, history: Sequence[HistoryEntry],
                  history_ids: Mapping[str, int] | None = None) -> HeldCallIds:
    """The call ids a new call of `state`'s thread may not take (`carried_calls`).

    The fold looks calls up by their ids: the thread's pending calls, its subscriptions, the
    answered calls it remembers, its children's spawn calls and the call that spawned it.
    And a provider refuses a request whose history repeats a call id (Anthropic: "tool_use
    ids must be unique"): every id in `history`, what the provider is sent, among them the
    calls a child or a fork inherited, which the thread never answered itself.

    `history_ids`: the ids of `history` as `note_call_ids` recorded them for a chain that
    `history` is a prefix of (the history cache keeps them per thread, `HistoryCache.call_ids`),
    so the history is not read. Why: reading every entry, its body and its calls at every
    completion with calls, a history's objects cold in memory, cost ~20 us (4% of a local
    completion at 2,000 agents x 20 turns, bench/README.md, stop 44)."""
    held = set(state.answered_calls)
    for pending in state.pending_calls:
        held.add(pending.call_id)
    for subscription in state.subscriptions:
        held.add(subscription.call_id)
    for child in state.children:
        held.add(child.spawn_call_id)
    if state.config.parent is not None:
        held.add(state.config.parent.spawn_call_id)
    if history_ids is None:
        found: dict[str, int] = {}
        note_call_ids(history, 0, found)
        history_ids = found
    return HeldCallIds(held, history_ids, len(history))


class HeldCallIds:
    """What `held_call_ids` found: the state's own ids, and the history's ids by the index of
    the entry that first mentions them, of which the first `visible` entries count (the ids
    map may go on to later entries of the same chain: the cache records them as they come)."""

    def __init__(self, own: set[str], history_ids: Mapping[str, int], visible: int) -> None:
        self._own = own
        self._history_ids = history_ids
        self._visible = visible

    def __contains__(self, call_id: object) -> bool:
        if not isinstance(call_id, str):
            return False
        if call_id in self._own:
            return True
        return self._history_ids.get(call_id, self._visible) < self._visible


def carried_calls(request_id: str, calls: tuple[ToolCall, ...], taken: Container[str],
                  ) -> tuple[ToolCall, ...]:
    """`calls` with ids the fold can bind a result to and every provider can be sent: each of
    `CARRIED_CALL_ID`, unique in the turn and not one of `taken` (`held_call_ids`). A call
    whose id breaks that gets `derive_id(request_id, "call", index)` instead, as the scripted
    model names its calls.

    Why here: the provider is not trusted to name calls well. Some servers send no id or the
    same one for every call, or reuse `call_0` each turn; a broken or hostile one can send an
    id of megabytes. Two calls of one id got one dispatch request id (it is derived from the
    call id), so the connector's journal ran only the first call's effect, and its one result
    ended both calls: the second call was lost without a word. Answered ids are remembered in the
    thread's rows, so huge ones grew the answered row past a row's bound, and from then on
    every result was refused as too large and the thread waited for good. A provider's id
    another provider refuses (`functions.search:0`) broke the thread once moved to it. The
    model sees the new id in the history it is sent, on the call and on its result alike, so
    the conversation stays consistent for any provider.
    """
    seen: set[str] = set()  # this turn's ids so far
    carried: list[ToolCall] = []
    renamed = False
    for index, call in enumerate(calls):
        call_id = call.call_id
        if call_id in seen or call_id in taken or CARRIED_CALL_ID.fullmatch(call_id) is None:
            call_id = derive_id(request_id, "call", str(index))
            again = 0
            while call_id in seen or call_id in taken:  # an earlier call named as this one is derived
                again += 1
                call_id = derive_id(request_id, "call", str(index), str(again))
            call = ToolCall(call_id, call.name, call.arguments)
            renamed = True
        seen.add(call_id)
        carried.append(call)
    return tuple(carried) if renamed else calls
