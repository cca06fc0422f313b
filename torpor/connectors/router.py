"""`ToolRouter`: several in-process connectors behind one `submit`, routed by tool name.

Local mode hands every committed dispatch to one object; the router passes it to the
connector that serves `dispatch.tool`. A dispatch for a tool nobody serves is answered
at once with an error result, so the call settles instead of hanging (the fold only
dispatches tools the thread was granted, so this is a configuration mistake: logged).
A connector whose tool raised answers through `failed` (the intake calls it), so the
error result carries that connector's source, as its own answers do.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from torpor.connectors.inprocess import INVOKE, InProcessConnector, InputSink, failure, text
from torpor.schemas.ids import derive_id
from torpor.schemas.records import ContentBlock, Dispatch, Input, ToolResult, ToolSpec

log = logging.getLogger(__name__)


class ToolRouter:
    """Routes dispatches to `connectors` by tool name; `busy` is the sum of theirs."""

    def __init__(self, connectors: Sequence[InProcessConnector], sink: InputSink) -> None:
        self._by_tool: dict[str, InProcessConnector] = {}
        for connector in connectors:
            for tool in connector.tools:
                if tool in self._by_tool:
                    raise ValueError(f"tool {tool!r} is served by two connectors")
                self._by_tool[tool] = connector
        self._connectors = tuple(connectors)
        self._sink = sink

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(spec for c in self._connectors for spec in c.specs)

    def spec(self, tool: str) -> ToolSpec:
        for spec in self.specs:
            if spec.name == tool:
                return spec
        raise KeyError(f"no local tool named {tool!r}; known: {sorted(self._by_tool)}")

    @property
    def busy(self) -> int:
        return sum(c.busy for c in self._connectors)

    def submit(self, dispatch: Dispatch) -> None:
        connector = self._by_tool.get(dispatch.tool)
        if connector is not None:
            connector.submit(dispatch)
            return
        log.error("no connector serves tool %r", dispatch.tool, extra={"thread_id": dispatch.thread_id})
        if dispatch.kind == INVOKE:
            self._answer(dispatch, text("no such tool here"))

    def failed(self, dispatch: Dispatch, error: BaseException) -> None:
        """The call's tool raised `error`: its connector answers with the error result."""
        connector = self._by_tool.get(dispatch.tool)
        if connector is not None:
            connector.failed(dispatch, error)
        else:
            self._answer(dispatch, failure(dispatch, error))

    def _answer(self, dispatch: Dispatch, content: tuple[ContentBlock, ...]) -> None:
        """An error result for a call no connector here serves, so it settles instead of hanging."""
        result = ToolResult(dispatch.call_id, dispatch.request_id, False, content, False)
        self._sink(
            Input(
                message_id=derive_id(dispatch.request_id, "result"),
                thread_id=dispatch.thread_id,
                created_at=dispatch.created_at,
                source="connector:router",
                expires_at=None,
                key_id=None,
                signature=None,
                body=result,
            )
        )

    def reconcile(self, dispatch: Dispatch) -> bool:
        connector = self._by_tool.get(dispatch.tool)
        return connector.reconcile(dispatch) if connector is not None else False

    async def close(self) -> None:
        for connector in self._connectors:
            await connector.close()
