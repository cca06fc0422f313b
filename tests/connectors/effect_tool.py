"""`effect`: a tool with an outside effect, for the connector crash tests.

Each invoke appends its request id to the file named by `TORPOR_TEST_EFFECT_FILE` (the
effect), then answers `done <n>`. Its `reconcile` looks for the request id in that file:
found, the effect happened and it answers without doing it again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Final

from torpor.connectors.inprocess import InProcessConnector, text
from torpor.schemas.records import Dispatch, ToolSpec

EFFECT_SPEC: Final = ToolSpec(
    name="effect",
    description="Append a line to a file (an effect outside Torpor).",
    parameters=json.dumps({"type": "object", "properties": {}, "additionalProperties": False}),
    result_schema=None,
    passive=False,
    toolset="test",
)


def _file() -> Path:
    return Path(os.environ["TORPOR_TEST_EFFECT_FILE"])


def effects() -> list[str]:
    path = _file()
    return path.read_text().split() if path.exists() else []


class EffectTool(InProcessConnector):
    name = "effect"
    specs = (EFFECT_SPEC,)

    def invoke(self, dispatch: Dispatch) -> None:
        with _file().open("a") as out:
            out.write(dispatch.request_id + "\n")
            out.flush()
            os.fsync(out.fileno())
        self.answer(dispatch, ok=True, content=text(f"done {len(effects())}"))

    def reconcile(self, dispatch: Dispatch) -> bool:
        if dispatch.request_id in effects():
            self.answer(dispatch, ok=True, content=text("done (reconciled)"))
            return True
        return False
