"""`echo`: an asynchronous tool that answers later, through the log, never inside the fold.

Arguments `{"text": str, "delay_s": number}`; after `delay_s` (default 0.05 s) it answers
`echo: <text>`. A `cancel` before then means no result at all (the fold has already
answered the call as interrupted).
"""

from __future__ import annotations

import asyncio
import json
from typing import Final

from torpor.connectors.inprocess import InProcessConnector, text
from torpor.schemas.records import Dispatch, ToolSpec

DEFAULT_DELAY_S: Final = 0.05

ECHO_SPEC: Final = ToolSpec(
    name="echo",
    description="Repeat a text back, after a delay (an asynchronous tool).",
    parameters=json.dumps(
        {
            "type": "object",
            "properties": {"text": {"type": "string"}, "delay_s": {"type": "number", "minimum": 0}},
            "required": ["text"],
            "additionalProperties": False,
        },
        sort_keys=True,
    ),
    result_schema=None,
    passive=False,
    toolset="local",
)


class EchoTool(InProcessConnector):
    name = "echo"
    specs = (ECHO_SPEC,)

    def invoke(self, dispatch: Dispatch) -> None:
        args = json.loads(dispatch.arguments)
        self.start(
            dispatch, self._later(dispatch, str(args["text"]), float(args.get("delay_s", DEFAULT_DELAY_S)))
        )

    async def _later(self, dispatch: Dispatch, value: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self.answer(dispatch, ok=True, content=text(f"echo: {value}"))
