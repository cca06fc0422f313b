"""`watch`: a subscription tool. It answers at once, then keeps sending `ToolEvent`s.

Arguments `{"topic": str, "events": [{"text": str, "associative": bool}, ...]}`. The
result (`subscription=true`) says the subscription started; then each event follows
after `interval_s` (default 0.05 s), numbered from 0, the last one `final`. Without
`events`, two are sent: one associative (goes inline into the thread) and one threaded
(handled by a temporary child thread). Event message ids derive from the request id and
the sequence, so a resent event is a duplicate.
"""

from __future__ import annotations

import asyncio
import json
from typing import Final

from torpor.connectors.inprocess import InProcessConnector, text
from torpor.schemas.records import Dispatch, ToolEvent, ToolSpec

DEFAULT_INTERVAL_S: Final = 0.05

WATCH_SPEC: Final = ToolSpec(
    name="watch",
    description="Subscribe to a topic; its events arrive later, one by one.",
    parameters=json.dumps(
        {
            "type": "object",
            "properties": {
                "topic": {"type": "string"},
                "interval_s": {"type": "number", "minimum": 0},
                "events": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"text": {"type": "string"}, "associative": {"type": "boolean"}},
                        "required": ["text"],
                    },
                },
            },
            "required": ["topic"],
            "additionalProperties": False,
        },
        sort_keys=True,
    ),
    result_schema=None,
    passive=False,
    toolset="local",
)


def default_events(topic: str) -> list[dict[str, object]]:
    return [
        {"text": f"{topic}: a routine update (associative)", "associative": True},
        {"text": f"{topic}: something that needs a look (threaded)", "associative": False},
    ]


class WatchTool(InProcessConnector):
    name = "watch"
    specs = (WATCH_SPEC,)

    def invoke(self, dispatch: Dispatch) -> None:
        args = json.loads(dispatch.arguments)
        topic = str(args["topic"])
        events = args.get("events") or default_events(topic)
        interval = float(args.get("interval_s", DEFAULT_INTERVAL_S))
        self.answer(dispatch, ok=True, content=text(f"subscribed to {topic}"), subscription=True)
        self.start(dispatch, self._send(dispatch, events, interval))

    async def _send(self, dispatch: Dispatch, events: list[dict[str, object]], interval: float) -> None:
        for sequence, event in enumerate(events):
            await asyncio.sleep(interval)
            body = ToolEvent(
                call_id=dispatch.call_id,
                request_id=dispatch.request_id,
                sequence=sequence,
                associative=bool(event.get("associative", False)),
                final=sequence == len(events) - 1,
                content=text(str(event["text"])),
            )
            self.produce(dispatch.thread_id, dispatch.request_id, body, "event", str(sequence))
