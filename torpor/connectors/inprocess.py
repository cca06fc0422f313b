"""The shape of an in-process connector: what local mode runs its tools with.

Contract. A connector serves the tools named in `specs`. `submit(dispatch)` is called
only for a dispatch that is durable (in local mode: after the step that made it was
applied), at least once; the connector does the work off the caller's path, in asyncio
tasks, and answers through `sink` with inputs whose message ids derive from the
dispatch's `request_id`, so a redelivered dispatch yields the same ids and the fold
absorbs the copy. A repeated `(request_id, kind)` is ignored here as well (the effect
journal of DESIGN section 7, kept in memory: local mode only).

Dispatch kinds: `invoke` starts the work, `cancel` stops the work of call `call_id`
(best effort; a late result is stale to the fold), `close_thread` stops all of a
thread's work, `approval_decision` carries a person's decision to the tool that asked.

`busy` counts work in progress that will produce an input by itself (a running tool, a
timer, a subscription still sending). Work waiting for a person is not busy: local mode
is idle then, and the scenario may answer.

Connectors import `torpor.schemas` only, never `torpor.processors` (DESIGN section 9).
Inputs are produced unsigned; the connector runtime signs them when it has a `Signer`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Final

from torpor.schemas.ids import derive_id
from torpor.schemas.records import ContentBlock, Dispatch, Input, InputBody, TextBlock, ToolResult, ToolSpec

log = logging.getLogger(__name__)

InputSink = Callable[[Input], None]
"""Produces an input to the `inputs` topic (local mode: the in-process log)."""
Clock = Callable[[], int]
"""Wall-clock milliseconds since the epoch: stamps the inputs a connector produces."""

INVOKE: Final = "invoke"
CANCEL: Final = "cancel"
CLOSE_THREAD: Final = "close_thread"
APPROVAL_DECISION: Final = "approval_decision"


def text(value: str) -> tuple[ContentBlock, ...]:
    return (TextBlock(value),)


def failure(dispatch: Dispatch, error: BaseException) -> tuple[ContentBlock, ...]:
    """The content of the error result of a call whose tool raised `error`: what the model reads."""
    try:
        why = f"{type(error).__name__}: {error}"
    except Exception:  # an exception whose __str__ raises still names its type
        why = type(error).__name__
    # Escaped, not refused: a lone surrogate in the message would make the answer unencodable.
    why = why.encode("utf-8", "backslashreplace").decode("utf-8")
    return text(f"{dispatch.tool} failed: {why}")


class InProcessConnector:
    """Base for local tools: idempotent dispatch intake, task bookkeeping, input building."""

    name: str = "inprocess"
    specs: tuple[ToolSpec, ...] = ()

    def __init__(self, sink: InputSink, clock: Clock) -> None:
        self._sink = sink
        self._clock = clock
        self._handled: set[tuple[str, str]] = set()
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}

    @property
    def source(self) -> str:
        return f"connector:{self.name}"

    @property
    def tools(self) -> frozenset[str]:
        return frozenset(spec.name for spec in self.specs)

    @property
    def busy(self) -> int:
        return len(self._tasks)

    def submit(self, dispatch: Dispatch) -> None:
        """Take one committed dispatch (at least once; a repeat is ignored)."""
        mark = (dispatch.request_id, dispatch.kind)
        if mark in self._handled:
            return
        self._handled.add(mark)
        where = {"thread_id": dispatch.thread_id, "message_id": dispatch.request_id}
        log.debug("dispatch %s %s", dispatch.kind, dispatch.tool, extra=where)
        if dispatch.kind == INVOKE:
            self.invoke(dispatch)
        elif dispatch.kind == CANCEL:
            self.cancel(dispatch.thread_id, dispatch.call_id)
        elif dispatch.kind == CLOSE_THREAD:
            for thread_id, call_id in list(self._tasks):
                if thread_id == dispatch.thread_id:
                    self.cancel(thread_id, call_id)
        elif dispatch.kind == APPROVAL_DECISION:
            self.decide(dispatch)
        else:
            log.warning("dispatch kind %r not understood: ignored", dispatch.kind, extra=where)

    def invoke(self, dispatch: Dispatch) -> None:
        """Start the call's work. Subclasses override; the default answers with an error."""
        self.answer(dispatch, ok=False, content=text(f"{self.name} does not serve {dispatch.tool}"))

    def reconcile(self, dispatch: Dispatch) -> bool:
        """An earlier process started `dispatch` and died before it answered: did the effect happen?

        Called by the connector runtime before any retry. Answer the call here (`answer`)
        and return True if the effect happened; return False to run it again. The
        default, False, is right for tools whose effect is idempotent or has none (echo,
        timers, reads); a tool with an outside effect overrides it and looks for that
        effect by `dispatch.request_id` (DESIGN 7).
        """
        return False

    def decide(self, dispatch: Dispatch) -> None:
        """A person decided on an approval this connector asked for (default: not expected)."""
        log.warning("unexpected approval decision", extra={"thread_id": dispatch.thread_id})

    def cancel(self, thread_id: str, call_id: str) -> None:
        task = self._tasks.pop((thread_id, call_id), None)
        if task is not None:
            task.cancel()

    def start(self, dispatch: Dispatch, work: Coroutine[object, object, None]) -> None:
        """Run `work` for the call as a task, tracked until it ends or is cancelled."""
        key = (dispatch.thread_id, dispatch.call_id)
        task = asyncio.get_running_loop().create_task(work, name=f"{self.name}:{dispatch.request_id}")
        self._tasks[key] = task

        def done(finished: asyncio.Task[None]) -> None:
            if self._tasks.get(key) is finished:
                del self._tasks[key]
            if not finished.cancelled() and (error := finished.exception()) is not None:
                log.error("tool work failed: %r", error, extra={
                    "thread_id": dispatch.thread_id, "request_id": dispatch.request_id})
                self.failed(dispatch, error)

        task.add_done_callback(done)

    def failed(self, dispatch: Dispatch, error: BaseException) -> None:
        """The tool raised `error` doing `dispatch`'s work (its task, or `submit` itself: the
        intake catches that): answer the call with an error result. The model reads it:
        never silence, never a hung call. The caller has logged `error`."""
        self.answer(dispatch, ok=False, content=failure(dispatch, error))

    def produce(
        self, thread_id: str, request_id: str, body: InputBody, *label: str, source: str | None = None
    ) -> None:
        """Send `body` to the thread, with a message id derived from `request_id` and `label`."""
        self._sink(
            Input(
                message_id=derive_id(request_id, *label),
                thread_id=thread_id,
                created_at=self._clock(),
                source=source or self.source,
                expires_at=None,
                key_id=None,
                signature=None,
                body=body,
            )
        )

    def answer(
        self, dispatch: Dispatch, ok: bool, content: tuple[ContentBlock, ...], subscription: bool = False
    ) -> None:
        """The call's one `ToolResult`."""
        result = ToolResult(dispatch.call_id, dispatch.request_id, ok, content, subscription)
        self.produce(dispatch.thread_id, dispatch.request_id, result, "result")

    async def close(self) -> None:
        """Cancel all work in progress (shutdown)."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
