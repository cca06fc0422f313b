"""The in-process timer connector: serves `sleep` and `sleep_until` (tool `timer`).

A dispatch to `timer` carries `{"due_at": <ms>, "tool": <name>}`; when the wall clock
passes `due_at` the connector sends `TimerFired(call_id, request_id, due_at)` with
source `timer`. A `cancel` (or `close_thread`) before then removes the timer.

Durable when served by the connector runtime (`torpor connector run-timers`): each
timer is an effect in the runtime's journal, so after any restart an unfired timer is
armed again from its dispatch (its `due_at` is in the arguments) and fires at its due
time, at once if that passed while the connector was down; a fired one is not re-armed
(its `TimerFired` is journaled and re-sent only if it was never delivered).
"""

from __future__ import annotations

import asyncio
import json
from typing import Final

from torpor.connectors.inprocess import InProcessConnector
from torpor.schemas.records import Dispatch, TimerFired, ToolSpec

TIMER_TOOL: Final = "timer"  # the name the fold dispatches sleeps to (processors.builtins.TIMER_TOOL)

TIMER_SPEC: Final = ToolSpec(
    name=TIMER_TOOL,
    description="Durable timers for sleep and sleep_until (dispatched by the runtime, not the model).",
    parameters='{"type":"object"}',
    result_schema=None,
    passive=True,
    toolset="builtin",
)


class TimerConnector(InProcessConnector):
    name = TIMER_TOOL
    specs = (TIMER_SPEC,)

    def invoke(self, dispatch: Dispatch) -> None:
        due_at = int(json.loads(dispatch.arguments)["due_at"])
        self.start(dispatch, self._fire_at(dispatch, due_at))

    async def _fire_at(self, dispatch: Dispatch, due_at: int) -> None:
        # Sleep in steps and re-read the clock: the wall clock, not the sleep, decides.
        while (remaining := due_at - self._clock()) > 0:
            await asyncio.sleep(min(remaining, 1_000) / 1000)
        body = TimerFired(call_id=dispatch.call_id, request_id=dispatch.request_id, due_at=due_at)
        self.produce(dispatch.thread_id, dispatch.request_id, body, "timer_fired", source="timer")
