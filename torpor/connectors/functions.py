"""Connectors from plain Python functions: `@tool` and `toolset`.

Contract::

    @tool(description="Add two integers.",
          parameters={"type": "object", "properties": {"a": {"type": "integer"},
                      "b": {"type": "integer"}}, "required": ["a", "b"]})
    async def add(args: dict[str, Any], call: Call) -> int:
        return args["a"] + args["b"]

    math = toolset("math", add)        # torpor connector run mymodule:math

A decorated function becomes a `FunctionTool`; `toolset(name, *tools)` groups tools into
one connector (source `connector:<name>`). Both are connector factories, what `torpor
connector run MODULE:NAME` and local mode take. The function gets the call's arguments
(already validated by the fold against `parameters`) and a `Call` (thread, call and
request ids, the capability snapshot, the attempt). It may be async or plain (a plain
one runs in a worker thread, so it may block). What it returns is the result: a string
as is, anything else as JSON. What it raises is an error result the model reads; a
cancel of the call cancels the task.

`@fn.reconciler` registers the tool's reconcile hook: `(call) -> result | None`, asked
after a crash whether the effect of `call.request_id` happened (return its result) or
not (None: the call runs again). Without one, a call whose connector died mid-effect is
run again: right for reads and idempotent effects, so give every tool with an outside
effect a reconciler.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from torpor.connectors.inprocess import Clock, InProcessConnector, InputSink, text
from torpor.schemas.records import Capability, Dispatch, ToolSpec

DEFAULT_TOOLSET: Final = "functions"

ToolFunction = Callable[[dict[str, Any], "Call"], Awaitable[object] | object]
Reconciler = Callable[["Call"], object | None]


@dataclass(frozen=True, slots=True)
class Call:
    """What a function tool knows about the call it serves."""

    thread_id: str
    call_id: str
    request_id: str
    capability: Capability
    attempt: int

    @classmethod
    def of(cls, dispatch: Dispatch) -> Call:
        return cls(dispatch.thread_id, dispatch.call_id, dispatch.request_id, dispatch.capability,
                   dispatch.attempt)


class FunctionTool:
    """One tool made from a function (see the module docstring). Also a connector factory."""

    def __init__(self, fn: ToolFunction, spec: ToolSpec) -> None:
        self.fn = fn
        self.spec = spec
        self.reconcile: Reconciler | None = None

    def reconciler(self, fn: Reconciler) -> Reconciler:
        """Decorator: the tool's reconcile hook (module docstring)."""
        self.reconcile = fn
        return fn

    def __call__(self, sink: InputSink, clock: Clock) -> FunctionConnector:
        return FunctionConnector(self.spec.toolset or DEFAULT_TOOLSET, (self,), sink, clock)


def tool(*, description: str, parameters: dict[str, Any] | None = None, name: str | None = None,
         result_schema: dict[str, Any] | None = None, passive: bool = False,
         toolset: str = DEFAULT_TOOLSET) -> Callable[[ToolFunction], FunctionTool]:
    """Decorator: make `fn` a tool named `name` (default: the function's name)."""
    def wrap(fn: ToolFunction) -> FunctionTool:
        spec = ToolSpec(
            name=name or fn.__name__,
            description=description,
            parameters=json.dumps(parameters or {"type": "object"}, sort_keys=True),
            result_schema=None if result_schema is None else json.dumps(result_schema, sort_keys=True),
            passive=passive,
            toolset=toolset,
        )
        return FunctionTool(fn, spec)
    return wrap


class Toolset:
    """Several function tools served by one connector. A connector factory."""

    def __init__(self, name: str, tools: tuple[FunctionTool, ...]) -> None:
        names = [t.spec.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"toolset {name!r} names a tool twice: {names}")
        self.name = name
        self.tools = tools

    def __call__(self, sink: InputSink, clock: Clock) -> FunctionConnector:
        return FunctionConnector(self.name, self.tools, sink, clock)


def toolset(name: str, *tools: FunctionTool) -> Toolset:
    """One connector named `name` serving `tools` (module docstring)."""
    return Toolset(name, tools)


class FunctionConnector(InProcessConnector):
    """Serves function tools through the `InProcessConnector` machinery."""

    def __init__(self, name: str, tools: tuple[FunctionTool, ...], sink: InputSink, clock: Clock) -> None:
        super().__init__(sink, clock)
        self.name = name
        self._tools = {t.spec.name: t for t in tools}
        self.specs = tuple(t.spec for t in tools)

    def invoke(self, dispatch: Dispatch) -> None:
        found = self._tools.get(dispatch.tool)
        if found is None:
            super().invoke(dispatch)
            return
        self.start(dispatch, self._run(found, dispatch))

    async def _run(self, found: FunctionTool, dispatch: Dispatch) -> None:
        args = json.loads(dispatch.arguments or "{}")
        call = Call.of(dispatch)
        if inspect.iscoroutinefunction(found.fn):
            value = await found.fn(args, call)
        else:
            value = await asyncio.to_thread(found.fn, args, call)
            if inspect.isawaitable(value):
                value = await value
        self.answer(dispatch, ok=True, content=text(as_text(value)))

    def reconcile(self, dispatch: Dispatch) -> bool:
        found = self._tools.get(dispatch.tool)
        if found is None or found.reconcile is None:
            return False
        value = found.reconcile(Call.of(dispatch))
        if value is None:
            return False
        self.answer(dispatch, ok=True, content=text(as_text(value)))
        return True


def as_text(value: object) -> str:
    """A tool's return value as the result's text: a string as is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
